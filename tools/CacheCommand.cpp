// `rnnc cache ls|clear|stats`: what the on-disk compile cache (runtime/exec/CompileCache.h) holds.
#include "ir/Error.h"
#include "runtime/exec/CompileCache.h"
#include "tools/Commands.h"

#include <fmt/format.h>

#include <ctime>
#include <memory>

namespace rnnc::tools {
namespace {

struct CacheCommandOptions {
  std::string action;
  std::string directory; // empty: the default
};

std::string humanBytes(int64_t bytes) {
  if (bytes < 1024)
    return fmt::format("{} B", bytes);
  if (bytes < 1024 * 1024)
    return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024);
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024 * 1024));
}

int cache(const CacheCommandOptions& o) {
  const std::string directory = o.directory.empty() ? defaultCacheDirectory() : o.directory;
  if (directory.empty())
    throw UserError("no cache directory: set RNNC_CACHE_DIR, XDG_CACHE_HOME or HOME");
  DiskCache disk(directory);
  if (!disk.usable())
    throw UserError("the compile cache " + directory + " cannot be used (see the warning)");
  if (o.action == "clear") {
    fmt::print("removed {} entries from {}\n", disk.clear(), directory);
    return 0;
  }
  const std::vector<DiskCache::EntryInfo> entries = disk.entries();
  int64_t total = 0;
  for (const DiskCache::EntryInfo& entry : entries)
    total += entry.bytes;
  if (o.action == "ls") {
    for (const DiskCache::EntryInfo& entry : entries) {
      char used[32] = {};
      std::tm local{};
      localtime_r(&entry.used, &local);
      std::strftime(used, sizeof used, "%Y-%m-%d %H:%M:%S", &local);
      fmt::print("{}  {:>10}  {}  {}\n", entry.file.substr(0, 16), humanBytes(entry.bytes), used,
                 entry.summary);
    }
    fmt::print("{} entries, {} in {}\n", entries.size(), humanBytes(total), directory);
    return 0;
  }
  const DiskCache::Counts counts = disk.counts();
  const int64_t lookups = counts.hits + counts.misses;
  fmt::print("directory: {}\n", directory);
  fmt::print("entries:   {}\n", entries.size());
  fmt::print("size:      {} of at most {} (RNNC_CACHE_MAX_BYTES; least recently used go "
             "first)\n",
             humanBytes(total), humanBytes(maxCacheBytes()));
  fmt::print("lookups:   {} hits, {} misses{}\n", counts.hits, counts.misses,
             lookups > 0 ? fmt::format(" ({:.0f}% hits)", 100.0 * counts.hits / lookups) : "");
  return 0;
}

} // namespace

CommandAction addCacheCommand(CLI::App& app) {
  auto o = std::make_shared<CacheCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "cache", "The on-disk compile cache: ls (its entries), clear (delete them), stats (where it "
               "is, entries, size, hits)");
  cmd->add_option("action", o->action, "ls, clear or stats")
      ->required()
      ->check(CLI::IsMember({"ls", "clear", "stats"}));
  cmd->add_option("--dir", o->directory,
                  "The cache directory (default: $RNNC_CACHE_DIR, else $XDG_CACHE_HOME/rnnc, else "
                  "~/.cache/rnnc)");
  return [o] { return cache(*o); };
}

} // namespace rnnc::tools

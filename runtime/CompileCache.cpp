#include "runtime/CompileCache.h"

#include "ir/FileIO.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <unistd.h>

namespace rnnc {
namespace {

constexpr std::string_view kMagic = "RNNC-CACHE-1\n";

uint64_t fnv1a(std::string_view text, uint64_t seed) {
  uint64_t hash = seed;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

void appendU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

bool readU64(std::string_view bytes, size_t& at, uint64_t& v) {
  if (bytes.size() - at < 8 || at > bytes.size())
    return false;
  v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  at += 8;
  return true;
}

const char* environment(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

} // namespace

CacheOptions CacheOptions::fromEnvironment() {
  CacheOptions options;
  if (const char* off = environment("RNNC_NO_CACHE"))
    options.disk = std::string(off) == "0";
  if (const char* dir = environment("RNNC_CACHE_DIR"))
    options.directory = dir;
  return options;
}

std::string defaultCacheDirectory() {
  if (const char* dir = environment("RNNC_CACHE_DIR"))
    return dir;
  if (const char* xdg = environment("XDG_CACHE_HOME"))
    return std::string(xdg) + "/rnnc";
  if (const char* home = environment("HOME"))
    return std::string(home) + "/.cache/rnnc";
  return std::filesystem::temp_directory_path().string() + "/rnnc-cache";
}

std::string digest(const std::string& text) {
  char out[33];
  std::snprintf(out, sizeof out, "%016llx%016llx",
                static_cast<unsigned long long>(fnv1a(text, 0xcbf29ce484222325ULL)),
                static_cast<unsigned long long>(fnv1a(text, 0x84222325cbf29ce4ULL)));
  return out;
}

DiskCache::DiskCache(std::string directory)
    : directory_(directory.empty() ? defaultCacheDirectory() : std::move(directory)) {}

std::string DiskCache::pathFor(const std::string& key) const {
  return directory_ + "/" + digest(key) + ".o";
}

std::optional<std::string> DiskCache::load(const std::string& key) const {
  std::string bytes;
  try {
    bytes = readFileBytes(pathFor(key));
  } catch (const std::exception&) {
    return std::nullopt; // absent or unreadable: a miss
  }
  std::string_view view = bytes;
  if (!view.starts_with(kMagic) || view.size() < kMagic.size() + 8)
    return std::nullopt;
  uint64_t checksum = 0;
  size_t end = view.size() - 8;
  size_t at = end;
  if (!readU64(view, at, checksum) || checksum != fnv1a(view.substr(0, end), 0))
    return std::nullopt;
  at = kMagic.size();
  uint64_t keyLength = 0, objectLength = 0;
  if (!readU64(view, at, keyLength) || keyLength > end - at || view.substr(at, keyLength) != key)
    return std::nullopt; // a different key with the same digest, or a stale format
  at += keyLength;
  if (!readU64(view, at, objectLength) || objectLength != end - at)
    return std::nullopt;
  return std::string(view.substr(at, objectLength));
}

void DiskCache::store(const std::string& key, const std::string& object) const {
  std::error_code ec;
  std::filesystem::create_directories(directory_, ec);
  if (ec)
    return;
  std::string entry(kMagic);
  appendU64(entry, key.size());
  entry += key;
  appendU64(entry, object.size());
  entry += object;
  appendU64(entry, fnv1a(entry, 0));
  static std::atomic<uint64_t> counter{0};
  std::string temporary = pathFor(key) + ".tmp." + std::to_string(getpid()) + "." +
                          std::to_string(counter++) + "." + std::to_string(std::random_device{}());
  try {
    writeFileBytes(temporary, {entry});
  } catch (const std::exception&) {
    std::filesystem::remove(temporary, ec);
    return;
  }
  // rename() replaces atomically: readers see the old entry or the new one, never a mix.
  std::filesystem::rename(temporary, pathFor(key), ec);
  if (ec)
    std::filesystem::remove(temporary, ec);
}

} // namespace rnnc

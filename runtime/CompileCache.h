// The on-disk compile cache: object files keyed by everything that determines them, so a second
// process skips LLVM. Entries are verified (magic, lengths, the full key text, a checksum) and
// anything wrong is a miss that gets recompiled and overwritten, never trusted. Writes go to a
// temporary file renamed into place, so concurrent writers cannot leave a torn entry.
#pragma once

#include <optional>
#include <string>

namespace rnnc {

struct CacheOptions {
  bool disk = true;      // use the on-disk cache
  std::string directory; // empty: defaultCacheDirectory()

  // RNNC_CACHE_DIR overrides the directory; RNNC_NO_CACHE=1 turns the disk cache off.
  static CacheOptions fromEnvironment();
};

// $RNNC_CACHE_DIR, else $XDG_CACHE_HOME/rnnc, else ~/.cache/rnnc.
std::string defaultCacheDirectory();

// A 128-bit hex digest of `text` (two FNV-1a passes); names cache files.
std::string digest(const std::string& text);

class DiskCache {
public:
  explicit DiskCache(std::string directory);

  // The object stored under exactly `key`, or nullopt when absent, unreadable or corrupt.
  std::optional<std::string> load(const std::string& key) const;
  // Stores best-effort: a cache that cannot be written only costs the next process a compile.
  void store(const std::string& key, const std::string& object) const;

  std::string pathFor(const std::string& key) const;

private:
  std::string directory_;
};

} // namespace rnnc

// The on-disk compile cache: object files keyed by everything that determines them (the
// optimised IR with its sizes, the code generator's sources, the rnnc and LLVM versions, the
// target CPU and its features), so a second process skips LLVM. Loading native code from disk
// is only as safe as the directory, so the cache trusts nothing (issue 18):
//   - the directory is private: this user's, not a link, mode 0700 (narrowed if wider); one that
//     belongs to someone else is not used, with a warning; there is no shared default (no
//     temporary directory: another user could create it first);
//   - an entry is a regular file of this user's, opened without following links or blocking (a
//     FIFO), at most maxCacheEntryBytes() long, verified in full (SHA-256 over the rest, then its
//     exact key text) before any of it is used; one that fails any check is deleted, and so is
//     one whose code the JIT cannot load (runtime/exec/CompiledCell), to be rebuilt;
//   - writes go to a fresh temporary file (O_EXCL, 0600) renamed into place, so concurrent
//     writers cannot leave a torn entry;
//   - the least recently used entries go when the directory grows past maxCacheBytes().
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

namespace rnnc {

struct CacheOptions {
  bool disk = true;      // use the on-disk cache
  std::string directory; // empty: defaultCacheDirectory()

  // RNNC_CACHE_DIR overrides the directory; RNNC_NO_CACHE=1 turns the disk cache off.
  static CacheOptions fromEnvironment();
};

// $RNNC_CACHE_DIR, else $XDG_CACHE_HOME/rnnc, else ~/.cache/rnnc; empty when none is set.
std::string defaultCacheDirectory();

// Makes `directory` ready for private use (created 0700; an existing one must be a real
// directory owned by this user, and is narrowed to 0700). Returns why it cannot be used, or
// an empty string.
std::string preparePrivateDirectory(const std::string& directory);

// The SHA-256 of `text` in hex; names cache files.
std::string digest(const std::string& text);

// An entry's bytes: magic, the key's length and text, the object's length and bytes, and the
// SHA-256 of all of that.
std::string encodeCacheEntry(const std::string& key, const std::string& object);

// 256 MiB per entry and 1 GiB in all, or RNNC_CACHE_MAX_ENTRY_BYTES and RNNC_CACHE_MAX_BYTES.
int64_t maxCacheEntryBytes();
int64_t maxCacheBytes();

class DiskCache {
public:
  // Empty `directory`: defaultCacheDirectory(). A directory that cannot be used privately
  // makes a cache that misses and stores nothing (and says so once on stderr).
  explicit DiskCache(std::string directory);
  // What the entries hold: compiled code (`<digest>.o`, what ls, stats and the size limit count,
  // and what hits and misses are counted for) or the targets LLVM gave for this machine
  // (`<digest>.target`: runtime/exec/TargetMemo.h; clear() deletes them too).
  enum class Holds { Code, Targets };
  DiskCache(std::string directory, Holds holds);

  bool usable() const { return usable_; }
  // The object stored under exactly `key`, or nullopt when absent or refused (and deleted).
  std::optional<std::string> load(const std::string& key) const;
  // Stores best-effort: a cache that cannot be written only costs the next process a compile.
  void store(const std::string& key, const std::string& object) const;
  // Deletes the entry for `key`: its code did not load.
  void remove(const std::string& key) const;

  std::string pathFor(const std::string& key) const;
  const std::string& directory() const { return directory_; }

  // For `rnnc cache`: the entries (verified ones: their key says what they hold), the
  // least recently used first; every entry and leftover temporary file deleted (how many);
  // and the hits and misses of load() in every process that used this directory (kept in its
  // `stats` file, updated under a lock).
  struct EntryInfo {
    std::string file;    // the entry's file name
    int64_t bytes = 0;   // its size on disk
    std::time_t used{};  // when it was last loaded or written
    std::string summary; // the cell and target its key names, or why it is not a valid entry
  };
  std::vector<EntryInfo> entries() const;
  int64_t clear() const; // everything; returns how many code entries went
  struct Counts {
    int64_t hits = 0, misses = 0;
  };
  Counts counts() const;

private:
  void prune() const;
  void count(bool hit) const;
  std::optional<std::string> loadVerified(const std::string& key) const;
  std::string directory_;
  bool usable_ = false;
  Holds holds_ = Holds::Code;
};

} // namespace rnnc

#include "runtime/exec/CompileCache.h"

#include "ir/Environment.h"
#include "ir/Error.h"
#include "ir/FileIO.h"

#include <fmt/format.h>
#include <nettle/sha2.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rnnc {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kEntryMagic = "RNNC-CACHE-2\n";
constexpr size_t kDigestBytes = 32; // SHA-256

std::string sha256(std::string_view bytes) {
  static_assert(SHA256_DIGEST_SIZE == kDigestBytes);
  sha256_ctx context;
  sha256_init(&context);
  sha256_update(&context, bytes.size(), reinterpret_cast<const uint8_t*>(bytes.data()));
  std::string out(kDigestBytes, '\0');
  sha256_digest(&context, out.size(), reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

void appendU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

bool readU64(std::string_view bytes, size_t& at, uint64_t& v) {
  if (at > bytes.size() || bytes.size() - at < 8)
    return false;
  v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  at += 8;
  return true;
}

// An entry's key and object (encodeCacheEntry's inverse), verified in full before anything is
// used: the magic, the digest over the rest, both lengths. Otherwise nullopt and `why`.
struct DecodedEntry {
  std::string_view key, object;
};
std::optional<DecodedEntry> decodeCacheEntry(std::string_view bytes, std::string& why) {
  if (!bytes.starts_with(kEntryMagic) || bytes.size() < kEntryMagic.size() + 16 + kDigestBytes) {
    why = "not an rnnc cache entry (or an older format)";
    return std::nullopt;
  }
  const size_t end = bytes.size() - kDigestBytes;
  if (sha256(bytes.substr(0, end)) != bytes.substr(end)) {
    why = "corrupt: its checksum does not match (deleted when next looked up)";
    return std::nullopt;
  }
  size_t at = kEntryMagic.size();
  uint64_t keyLength = 0, objectLength = 0;
  DecodedEntry entry;
  if (readU64(bytes, at, keyLength) && keyLength <= end - at) {
    entry.key = bytes.substr(at, keyLength);
    at += keyLength;
    if (readU64(bytes, at, objectLength) && objectLength == end - at) {
      entry.object = bytes.substr(at, objectLength);
      return entry;
    }
  }
  why = "corrupt lengths";
  return std::nullopt;
}

const char* environment(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

// One warning per directory and process: a cache that cannot be used is worth saying once.
void warnOnce(const std::string& directory, const std::string& why) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mutex);
  if (warned.insert(directory).second)
    std::fprintf(stderr,
                 "rnnc: warning: not using the compile cache %s: %s; compiling without it\n",
                 directory.c_str(), why.c_str());
}

constexpr const char* kTargetSuffix = ".target";

bool isEntryName(const fs::path& path) {
  return path.extension() == ".o" && path.stem().string().size() == 2 * kDigestBytes;
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
  return ""; // never a shared temporary directory: another user could have made it first
}

std::string preparePrivateDirectory(const std::string& directory) {
  if (directory.empty())
    return "no directory (set RNNC_CACHE_DIR, XDG_CACHE_HOME or HOME)";
  std::error_code ec;
  fs::path path(directory);
  if (path.has_parent_path())
    fs::create_directories(path.parent_path(), ec); // the parents are the user's business
  if (mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST)
    return fmt::format("cannot create it: {}", std::strerror(errno));
  // Opened without following a link, so that what is checked is what is used.
  int fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return errno == ELOOP || errno == ENOTDIR
               ? std::string("it is not a directory (a symbolic link or a file)")
               : fmt::format("cannot open it: {}", std::strerror(errno));
  struct stat info{};
  std::string why;
  if (fstat(fd, &info) != 0)
    why = fmt::format("cannot inspect it: {}", std::strerror(errno));
  else if (info.st_uid != geteuid())
    why = fmt::format("it belongs to user id {}, not to this user ({})", info.st_uid, geteuid());
  else if ((info.st_mode & 077) != 0 && fchmod(fd, 0700) != 0)
    why = fmt::format("others may write to it and it cannot be made private: {}",
                      std::strerror(errno));
  close(fd);
  return why;
}

std::string digest(const std::string& text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : sha256(text)) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::string encodeCacheEntry(const std::string& key, const std::string& object) {
  std::string entry(kEntryMagic);
  appendU64(entry, key.size());
  entry += key;
  appendU64(entry, object.size());
  entry += object;
  entry += sha256(entry);
  return entry;
}

int64_t maxCacheEntryBytes() {
  return environmentLimit("RNNC_CACHE_MAX_ENTRY_BYTES", int64_t{256} << 20, "a byte count");
}

int64_t maxCacheBytes() {
  return environmentLimit("RNNC_CACHE_MAX_BYTES", int64_t{1} << 30, "a byte count");
}

DiskCache::DiskCache(std::string directory) : DiskCache(std::move(directory), Holds::Code) {}

DiskCache::DiskCache(std::string directory, Holds holds)
    : directory_(directory.empty() ? defaultCacheDirectory() : std::move(directory)),
      holds_(holds) {
  std::string why = preparePrivateDirectory(directory_);
  usable_ = why.empty();
  if (!usable_)
    warnOnce(directory_.empty() ? "(none)" : directory_, why);
}

std::string DiskCache::pathFor(const std::string& key) const {
  return directory_ + "/" + digest(key) + (holds_ == Holds::Code ? ".o" : kTargetSuffix);
}

void DiskCache::remove(const std::string& key) const {
  if (usable_)
    unlink(pathFor(key).c_str());
}

std::optional<std::string> DiskCache::load(const std::string& key) const {
  if (!usable_)
    return std::nullopt;
  std::optional<std::string> object = loadVerified(key);
  if (holds_ == Holds::Code)
    count(object.has_value());
  return object;
}

std::optional<std::string> DiskCache::loadVerified(const std::string& key) const {
  const std::string path = pathFor(key);
  // Not following links, not blocking on a FIFO: only this user's regular files are entries.
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT)
      unlink(path.c_str()); // a link or something else that is no entry
    return std::nullopt;
  }
  auto reject = [&] {
    close(fd);
    unlink(path.c_str()); // rebuilt by the caller, not failing every later run
    return std::nullopt;
  };
  struct stat info{};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) || info.st_uid != geteuid() ||
      info.st_size > maxCacheEntryBytes())
    return reject();
  std::string bytes(static_cast<size_t>(info.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n <= 0)
      return reject();
    done += static_cast<size_t>(n);
  }
  // Verified in full before anything is used, then the exact key (not another under this name).
  std::string why;
  std::optional<DecodedEntry> entry = decodeCacheEntry(bytes, why);
  if (!entry || entry->key != key)
    return reject();
  futimens(fd, nullptr); // used now: the last to go when the cache is pruned
  close(fd);
  return std::string(entry->object);
}

void DiskCache::store(const std::string& key, const std::string& object) const {
  if (!usable_)
    return;
  const std::string entry = encodeCacheEntry(key, object);
  if (static_cast<int64_t>(entry.size()) > maxCacheEntryBytes())
    return;
  static std::atomic<uint64_t> counter{0};
  const std::string temporary =
      fmt::format("{}.tmp.{}.{}.{}", pathFor(key), getpid(), counter++, std::random_device{}());
  int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return; // best effort: a cache that cannot be written costs the next process a compile
  size_t done = 0;
  while (done < entry.size()) {
    ssize_t n = write(fd, entry.data() + done, entry.size() - done);
    if (n <= 0)
      break;
    done += static_cast<size_t>(n);
  }
  bool ok = done == entry.size();
  ok = close(fd) == 0 && ok;
  // rename() replaces atomically: readers see the old entry or the new one, never a mix.
  if (!ok || rename(temporary.c_str(), pathFor(key).c_str()) != 0) {
    unlink(temporary.c_str());
    return;
  }
  prune();
}

void DiskCache::prune() const {
  struct Entry {
    fs::path path;
    int64_t bytes;
    fs::file_time_type used;
  };
  std::vector<Entry> entries;
  int64_t total = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(directory_, ec), endIt; !ec && it != endIt; it.increment(ec)) {
    const fs::path& path = it->path();
    auto status = it->symlink_status(ec);
    if (ec || !fs::is_regular_file(status))
      continue;
    auto time = it->last_write_time(ec);
    if (ec)
      continue;
    // A writer that died between writing and renaming left this behind.
    if (path.filename().string().find(".o.tmp.") != std::string::npos) {
      if (now - time > std::chrono::hours(1))
        fs::remove(path, ec);
      continue;
    }
    if (!isEntryName(path))
      continue;
    int64_t bytes = static_cast<int64_t>(it->file_size(ec));
    if (ec)
      continue;
    entries.push_back({path, bytes, time});
    total += bytes;
  }
  const int64_t most = maxCacheBytes();
  if (total <= most)
    return;
  // The least recently used first, down to three quarters of the limit.
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.used < b.used; });
  for (const Entry& entry : entries) {
    if (total <= most / 4 * 3)
      break;
    if (fs::remove(entry.path, ec))
      total -= entry.bytes;
  }
}

namespace {

constexpr const char* kStatsFile = "stats";

// The key text of the entry at `path` if it is a valid entry (as load() checks it), else why not.
std::optional<std::string> entryKey(const fs::path& path, std::string& why) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::optional<DecodedEntry> entry = decodeCacheEntry(bytes, why);
  return entry ? std::optional<std::string>(entry->key) : std::nullopt;
}

// "lstm(input_size = 512, hidden_size = 512) for znver3, fp32 weights" out of a key.
std::string summariseKey(const std::string& key) {
  auto line = [&](const std::string& prefix) -> std::string {
    size_t at = key.find("\n" + prefix);
    if (at == std::string::npos)
      return "?";
    at += 1 + prefix.size();
    return key.substr(at, key.find('\n', at) - at);
  };
  std::string cell = "?";
  if (size_t at = key.find("cell @"); at != std::string::npos)
    cell = key.substr(at + 6, key.find(" {", at) - at - 6);
  // The target line is "triple cpu w8 r16 ...": its CPU.
  std::string target = line("target ");
  if (size_t space = target.find(' '); space != std::string::npos)
    target = target.substr(space + 1, target.find(' ', space + 1) - space - 1);
  return cell + " for " + target + ", " + line("weights ") + " weights";
}

} // namespace

std::vector<DiskCache::EntryInfo> DiskCache::entries() const {
  std::vector<EntryInfo> result;
  std::error_code ec;
  for (fs::directory_iterator it(directory_, ec), endIt; !ec && it != endIt; it.increment(ec)) {
    if (!isEntryName(it->path()) || !fs::is_regular_file(it->symlink_status(ec)))
      continue;
    struct stat info{};
    if (stat(it->path().c_str(), &info) != 0)
      continue;
    EntryInfo entry;
    entry.file = it->path().filename().string();
    entry.bytes = static_cast<int64_t>(info.st_size);
    entry.used = info.st_mtime;
    std::string why;
    std::optional<std::string> key = entryKey(it->path(), why);
    entry.summary = key ? summariseKey(*key) : why;
    result.push_back(std::move(entry));
  }
  std::sort(result.begin(), result.end(),
            [](const EntryInfo& a, const EntryInfo& b) { return a.used < b.used; });
  return result;
}

int64_t DiskCache::clear() const {
  int64_t removed = 0;
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(directory_, ec), endIt; !ec && it != endIt; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (isEntryName(it->path()) || it->path().extension() == kTargetSuffix ||
        name.find(".o.tmp.") != std::string::npos ||
        name.find(std::string(kTargetSuffix) + ".tmp.") != std::string::npos || name == kStatsFile)
      doomed.push_back(it->path());
  }
  for (const fs::path& path : doomed)
    if (fs::remove(path, ec) && isEntryName(path)) // the code entries, as ls counts them
      ++removed;
  return removed;
}

// The stats file: "hits N\nmisses M\n", read and rewritten under an exclusive lock so that
// concurrent processes do not lose counts. Best effort, as the cache itself.
void DiskCache::count(bool hit) const {
  const std::string path = directory_ + "/" + kStatsFile;
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return;
  if (flock(fd, LOCK_EX) == 0) {
    char text[128] = {};
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    long long hits = 0, misses = 0;
    if (n > 0)
      std::sscanf(text, "hits %lld\nmisses %lld", &hits, &misses);
    (hit ? hits : misses) += 1;
    // Fixed-width numbers, written over the old ones: no truncation, which cost 0.15 ms on
    // ext4 (and a flush when the file is closed), a third of a cache hit.
    const std::string updated = fmt::format("hits {:020}\nmisses {:020}\n", hits, misses);
    if (pwrite(fd, updated.data(), updated.size(), 0) < 0) {
      // nothing to do: a lost count only makes `rnnc cache stats` less exact
    }
    flock(fd, LOCK_UN);
  }
  close(fd);
}

DiskCache::Counts DiskCache::counts() const {
  Counts counts;
  std::ifstream in(directory_ + "/" + kStatsFile);
  std::string word;
  long long value = 0;
  while (in >> word >> value)
    (word == "hits" ? counts.hits : counts.misses) = value;
  return counts;
}

} // namespace rnnc

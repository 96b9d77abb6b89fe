#include "ir/FileIO.h"

#include "ir/Environment.h"
#include "ir/Error.h"
#include "ir/HugePages.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rnnc {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw UserError(fmt::format("{}: {}: {}", path, what, std::strerror(errno)));
}

} // namespace

int64_t maxFileBytes() {
  return environmentLimit("RNNC_MAX_FILE_BYTES", int64_t{64} << 30, "a byte count");
}

namespace {

// An open file that may be read whole: a regular file or a pipe, at most maxFileBytes().
struct CheckedFile {
  FilePtr file;
  struct stat info {};
};

[[noreturn]] void failTooLarge(const std::string& path, int64_t most) {
  throw UserError(fmt::format("{}: the file is larger than {} bytes, the most rnnc reads "
                              "(RNNC_MAX_FILE_BYTES sets it)",
                              path, most));
}

CheckedFile openWholeFile(const std::string& path, const std::string& kind) {
  CheckedFile opened{FilePtr(std::fopen(path.c_str(), "rb"))};
  if (!opened.file)
    fail(path, "cannot open " + kind);
  if (fstat(fileno(opened.file.get()), &opened.info) != 0)
    fail(path, "cannot read " + kind);
  if (S_ISDIR(opened.info.st_mode)) {
    errno = EISDIR;
    fail(path, "cannot read " + kind);
  }
  if (!S_ISREG(opened.info.st_mode) && !S_ISFIFO(opened.info.st_mode))
    throw UserError(fmt::format("{}: cannot read {}: not a regular file or a pipe (a device "
                                "or socket is never read whole)",
                                path, kind));
  if (S_ISREG(opened.info.st_mode) && opened.info.st_size > maxFileBytes())
    failTooLarge(path, maxFileBytes());
  return opened;
}

std::string readOpened(CheckedFile& opened, const std::string& path, const std::string& kind) {
  const int64_t most = maxFileBytes();
  std::string bytes;
  try {
    if (S_ISREG(opened.info.st_mode))
      bytes.reserve(static_cast<size_t>(opened.info.st_size));
    char buffer[1 << 16];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, opened.file.get())) > 0) {
      if (static_cast<int64_t>(bytes.size() + n) > most)
        failTooLarge(path, most);
      bytes.append(buffer, n);
    }
  } catch (const std::bad_alloc&) {
    throw UserError(
        fmt::format("{}: out of memory reading the file ({} bytes read)", path, bytes.size()));
  }
  if (std::ferror(opened.file.get()))
    fail(path, "cannot read " + kind);
  return bytes;
}

// Files from this size on are read into huge pages (mapFileBytes).
constexpr int64_t kHugeReadBytes = int64_t{256} << 10;

} // namespace

std::string readFileBytes(const std::string& path, const std::string& kind) {
  CheckedFile opened = openWholeFile(path, kind);
  return readOpened(opened, path, kind);
}

FileMapping::~FileMapping() {
  munmap(data_, bytes_);
}

namespace {

// Up to `bytes` bytes of the file from `offset` into `into`, fewer only where the file ends
// first; the count read.
size_t readAt(int fd, void* into, size_t bytes, uint64_t offset, const std::string& path,
              const std::string& kind) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n =
        pread(fd, static_cast<char*>(into) + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      fail(path, "cannot read " + kind);
    if (n == 0)
      break;
    done += static_cast<size_t>(n);
  }
  return done;
}

} // namespace

FileBytes mapFileBytes(const std::string& path, const std::string& kind) {
  CheckedFile opened = openWholeFile(path, kind);
  FileBytes result;
  if (S_ISREG(opened.info.st_mode) && opened.info.st_size >= kHugeReadBytes) {
    // Read into memory on 2 MB pages: one page fault per 2 MB, where a mapping of the file's
    // 4 KB pages costs one per page on first touch (in a VM even with MAP_POPULATE, its shadow
    // page tables filled lazily: a 2 MB weight file mapped and copied took 3.9 ms on a Zen 5 VM,
    // read into huge pages 0.5 ms). The copy is private: a file truncated meanwhile cannot fault
    // its reader. Where no memory can be mapped, the file is mapped as below.
    const size_t bytes = static_cast<size_t>(opened.info.st_size);
    char* start = nullptr;
    try {
      start = static_cast<char*>(mapHugePages(bytes));
    } catch (const std::bad_alloc&) {
    }
    if (start) {
      result.mapping_ = std::make_unique<FileMapping>(start, wholeHugePages(bytes));
      // Fewer bytes where the file shrank since fstat: what it holds now.
      const size_t done = readAt(fileno(opened.file.get()), start, bytes, 0, path, kind);
      result.view_ = std::string_view(start, done);
      return result;
    }
  }
  if (S_ISREG(opened.info.st_mode) && opened.info.st_size > 0) {
    const size_t bytes = static_cast<size_t>(opened.info.st_size);
    // MAP_POPULATE maps every page of the file in this one call: a read() would copy each page
    // into fresh memory first, one page fault each (microseconds apiece in a VM).
    void* mapping =
        mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fileno(opened.file.get()), 0);
    if (mapping != MAP_FAILED) {
      result.mapping_ = std::make_unique<FileMapping>(static_cast<char*>(mapping), bytes);
      result.view_ = std::string_view(static_cast<const char*>(mapping), bytes);
      return result;
    }
  }
  result.read_ = std::make_unique<std::string>(readOpened(opened, path, kind));
  result.view_ = *result.read_;
  return result;
}

std::unique_ptr<PositionalFile> PositionalFile::open(const std::string& path,
                                                     const std::string& kind) {
  // Looked at before it is opened: opening a named pipe here and closing it again would cut
  // its writer off (SIGPIPE) before the whole-file reader opened it.
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode))
    return nullptr;
  CheckedFile opened = openWholeFile(path, kind);
  if (!S_ISREG(opened.info.st_mode))
    return nullptr;
  const int fd = dup(fileno(opened.file.get()));
  if (fd < 0)
    fail(path, "cannot open " + kind);
  return std::unique_ptr<PositionalFile>(
      new PositionalFile(fd, static_cast<uint64_t>(opened.info.st_size), path, kind));
}

PositionalFile::~PositionalFile() {
  close(fd_);
}

void PositionalFile::read(uint64_t offset, void* into, size_t bytes) const {
  const size_t done = readAt(fd_, into, bytes, offset, path_, kind_);
  if (done < bytes)
    throw UserError(fmt::format("{}: the {} ended at byte {}, before the {} bytes it had when "
                                "opened (was it truncated while being read?)",
                                path_, kind_, offset + done, size_));
}

std::shared_ptr<const FileMapping> PositionalFile::mapPrivately() const {
#ifdef MADV_POPULATE_READ
  if (size_ == 0)
    return nullptr;
  const auto bytes = static_cast<size_t>(size_);
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd_, 0);
  if (mapped == MAP_FAILED)
    return nullptr;
  auto mapping = std::make_shared<const FileMapping>(static_cast<char*>(mapped), bytes);
  // Pages made present for reading (a write still copies its page) in one call, where first
  // touches would fault page by page; MAP_POPULATE would copy every page of a writable private
  // mapping at once. The call fails where the file has shrunk past a page: nothing is touched.
  auto populate = [&](size_t from, size_t count) {
    return count == 0 || madvise(static_cast<char*>(mapped) + from, count, MADV_POPULATE_READ) == 0;
  };
  // The first few pages first, each read timed: a present page costs a TLB fill and a cache
  // miss (a fraction of a microsecond); a page whose host page table is filled at its first
  // touch costs microseconds, and reading the file into huge pages is then cheaper (a read
  // costs about kWorthIt per 4 KB). The fastest read decides, so that an interrupt during one
  // cannot; only then is the rest of the file made present.
  constexpr size_t kPage = 4096, kSampled = 8;
  constexpr std::chrono::duration<double> kWorthIt(1e-6);
  const size_t sampled = std::min(kSampled * kPage, bytes);
  if (!populate(0, sampled))
    return nullptr;
  volatile const char* pages = static_cast<const char*>(mapped);
  std::chrono::duration<double> fastest = std::chrono::hours(1);
  for (size_t at = 0; at < sampled; at += kPage) {
    const auto start = std::chrono::steady_clock::now();
    (void)pages[at];
    fastest =
        std::min<std::chrono::duration<double>>(fastest, std::chrono::steady_clock::now() - start);
  }
  if (fastest > kWorthIt || !populate(sampled, bytes - sampled))
    return nullptr;
  return mapping;
#else
  return nullptr; // no way to make the pages present in one call
#endif
}

void writeFileBytes(const std::string& path, const std::vector<std::string_view>& chunks) {
  // Overwritten in place and then cut to length, not truncated first: truncating a file of
  // some blocks on ext4 frees them in a journal transaction and the write allocates them again
  // (0.5 ms of a warm 2 ms-kernel `rnnc run` went to rewriting its 100 KB output that way).
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0)
    fail(path, "cannot open file for writing");
  // Written from the start; a regular file is then cut to what was written, also where the
  // writing failed part way (as a truncating write would have left it), never left holding the
  // old file's tail after the new bytes: a complete-looking file of mixed contents. A pipe or
  // terminal (/dev/stdout) has nothing to cut.
  struct stat info {};
  const bool regular = fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
  off_t written = 0;
  int error = 0;
  for (std::string_view chunk : chunks) {
    size_t done = 0;
    while (!error && done < chunk.size()) {
      const ssize_t n = ::write(fd, chunk.data() + done, chunk.size() - done);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        error = n < 0 ? errno : EIO;
        break;
      }
      done += static_cast<size_t>(n);
      written += n;
    }
  }
  if (regular && ::ftruncate(fd, written) != 0 && !error)
    error = errno;
  if (::close(fd) != 0 && !error) // a full disk (or NFS) may only be reported here
    error = errno;
  if (error) {
    errno = error;
    fail(path, "cannot write file");
  }
}

} // namespace rnnc

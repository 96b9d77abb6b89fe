#include "ir/FileIO.h"

#include "ir/Environment.h"
#include "ir/Error.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include <sys/mman.h>
#include <sys/stat.h>

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
  struct stat info{};
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

} // namespace

std::string readFileBytes(const std::string& path, const std::string& kind) {
  CheckedFile opened = openWholeFile(path, kind);
  return readOpened(opened, path, kind);
}

FileBytes::~FileBytes() {
  if (mapping_)
    munmap(mapping_, mappedBytes_);
}

FileBytes mapFileBytes(const std::string& path, const std::string& kind) {
  CheckedFile opened = openWholeFile(path, kind);
  FileBytes result;
  if (S_ISREG(opened.info.st_mode) && opened.info.st_size > 0) {
    const size_t bytes = static_cast<size_t>(opened.info.st_size);
    // MAP_POPULATE maps every page of the file in this one call: a read() would copy each page
    // into fresh memory first, one page fault each (microseconds apiece in a VM).
    void* mapping =
        mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fileno(opened.file.get()), 0);
    if (mapping != MAP_FAILED) {
      result.mapping_ = mapping;
      result.mappedBytes_ = bytes;
      result.view_ = std::string_view(static_cast<const char*>(mapping), bytes);
      return result;
    }
  }
  result.read_ = std::make_unique<std::string>(readOpened(opened, path, kind));
  result.view_ = *result.read_;
  return result;
}

void writeFileBytes(const std::string& path, const std::vector<std::string_view>& chunks) {
  FilePtr file(std::fopen(path.c_str(), "wb"));
  if (!file)
    fail(path, "cannot open file for writing");
  bool ok = true;
  for (std::string_view chunk : chunks)
    ok = ok &&
         (chunk.empty() || std::fwrite(chunk.data(), 1, chunk.size(), file.get()) == chunk.size());
  // fclose flushes the buffer, so a full disk may only be reported here.
  ok = std::fclose(file.release()) == 0 && ok;
  if (!ok)
    fail(path, "cannot write file");
}

} // namespace rnnc

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

std::string readFileBytes(const std::string& path, const std::string& kind) {
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (!file)
    fail(path, "cannot open " + kind);
  struct stat info{};
  if (fstat(fileno(file.get()), &info) != 0)
    fail(path, "cannot read " + kind);
  if (S_ISDIR(info.st_mode)) {
    errno = EISDIR;
    fail(path, "cannot read " + kind);
  }
  if (!S_ISREG(info.st_mode) && !S_ISFIFO(info.st_mode))
    throw UserError(fmt::format("{}: cannot read {}: not a regular file or a pipe (a device "
                                "or socket is never read whole)",
                                path, kind));
  const int64_t most = maxFileBytes();
  auto tooLarge = [&] {
    throw UserError(fmt::format("{}: the file is larger than {} bytes, the most rnnc reads "
                                "(RNNC_MAX_FILE_BYTES sets it)",
                                path, most));
  };
  if (S_ISREG(info.st_mode) && info.st_size > most)
    tooLarge();
  std::string bytes;
  try {
    if (S_ISREG(info.st_mode))
      bytes.reserve(static_cast<size_t>(info.st_size));
    char buffer[1 << 16];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) {
      if (static_cast<int64_t>(bytes.size() + n) > most)
        tooLarge();
      bytes.append(buffer, n);
    }
  } catch (const std::bad_alloc&) {
    throw UserError(
        fmt::format("{}: out of memory reading the file ({} bytes read)", path, bytes.size()));
  }
  if (std::ferror(file.get()))
    fail(path, "cannot read " + kind);
  return bytes;
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

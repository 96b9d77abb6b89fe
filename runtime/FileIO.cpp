#include "runtime/FileIO.h"

#include "ir/Error.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

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

std::string readFileBytes(const std::string& path) {
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (!file)
    fail(path, "cannot open file");
  std::string bytes;
  std::error_code ec;
  if (auto size = std::filesystem::file_size(path, ec); !ec)
    bytes.reserve(static_cast<size_t>(size));
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, file.get())) > 0)
    bytes.append(buffer, n);
  // fopen succeeds on a directory; the failure (EISDIR) only shows up here.
  if (std::ferror(file.get()))
    fail(path, "cannot read file");
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

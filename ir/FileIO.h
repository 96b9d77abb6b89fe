// Whole-file reads and writes with errors that name the file, for every reader: cells, IR dumps,
// tensor files, cache entries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rnnc {

// The file's bytes; throws UserError "PATH: cannot open file: REASON" (or read). Only regular
// files and pipes are read (a device such as /dev/zero never ends), and at most
// maxFileBytes(): a longer file, or one memory cannot hold, is an error naming the file.
// `kind` names the file in messages ("cell file": "PATH: cannot open cell file: REASON").
std::string readFileBytes(const std::string& path, const std::string& kind = "file");

// Memory this process mapped, unmapped when destroyed: a file's pages (PositionalFile's private
// mapping: the page cache's, no copy and nothing zeroed, a write copying the page written and
// never reaching the file; mapFileBytes's read-only one) or the 2 MB pages a file was read into.
class FileMapping {
public:
  FileMapping(char* data, size_t bytes) : data_(data), bytes_(bytes) {}
  ~FileMapping();
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;

  char* data() const { return data_; }
  size_t size() const { return bytes_; }

private:
  char* data_;
  size_t bytes_;
};

// The same file's bytes for large inputs read once, such as input sequences: a regular file of 256
// KB or more read into memory on 2 MB pages (a page fault each, not one per 4 KB); a smaller one
// mapped without copying (the page cache's pages, read-only: it must not shrink while the view
// is in use, as with any mapped file); a pipe read as above.
class FileBytes {
public:
  FileBytes() = default;
  FileBytes(FileBytes&& other) noexcept = default;
  FileBytes& operator=(FileBytes&&) = delete;
  FileBytes(const FileBytes&) = delete;

  std::string_view view() const { return view_; }

private:
  friend FileBytes mapFileBytes(const std::string& path, const std::string& kind);
  std::unique_ptr<FileMapping> mapping_;
  std::unique_ptr<std::string> read_; // a pipe's bytes (a heap string: the view survives moves)
  std::string_view view_;
};
FileBytes mapFileBytes(const std::string& path, const std::string& kind = "file");

// A regular file read piece by piece into memory its caller owns: a weight file's tensors each
// straight into their own storage, with no copy of the whole file in between (in a VM fresh
// memory costs about as much again as the copy: 0.4-1 ms per 2 MB to fault in and zero on an
// Intel VM, so a 2 MB weight file read whole cost two huge pages besides its tensors').
class PositionalFile {
public:
  // The open file, or nothing, without opening it, when `path` is not a regular file (a pipe:
  // read it whole with mapFileBytes, which also gives the errors for anything else); the same
  // errors as readFileBytes for a regular file that cannot be read or a missing one.
  static std::unique_ptr<PositionalFile> open(const std::string& path,
                                              const std::string& kind = "file");
  ~PositionalFile();
  PositionalFile(const PositionalFile&) = delete;
  PositionalFile& operator=(const PositionalFile&) = delete;

  uint64_t size() const { return size_; } // as when opened
  // Exactly `bytes` bytes from `offset`; a file that has shrunk since it was opened is a
  // UserError naming it.
  void read(uint64_t offset, void* into, size_t bytes) const;
  // The file mapped privately with every page present, for data used where it lies rather than
  // read into fresh memory (a weight file's tensors: runtime/data/SafeTensors.h). Nothing where
  // reading would be cheaper or the mapping unsafe to touch: an empty file, one that cannot be
  // mapped, one cut short since it was opened (its missing pages would fault), and a host where
  // a mapped page's first touch is slow. That cost differs by host, so it is measured on the
  // file's first pages: on the Intel VM of sessions 38-45 a touch cost a fraction of a
  // microsecond and a warm `rnnc run` of a 2 MB LSTM took 0.66 ms less than with the file read
  // (no copy, no huge page zeroed for it); on a Zen 5 VM, whose page tables were filled at each
  // page's first touch, a mapped 2 MB file took 3.9 ms to copy against 0.5 ms read.
  // The file must then keep its length while the mapping is in use (a page cut off faults), as
  // with any mapped file.
  std::shared_ptr<const FileMapping> mapPrivately() const;

private:
  PositionalFile(int fd, uint64_t size, std::string path, std::string kind)
      : fd_(fd), size_(size), path_(std::move(path)), kind_(std::move(kind)) {}
  int fd_;
  uint64_t size_;
  std::string path_, kind_;
};

// 64 GiB, or the environment variable RNNC_MAX_FILE_BYTES.
int64_t maxFileBytes();

// Writes the chunks one after another, replacing any existing file; throws UserError on failure,
// including a full disk reported only when the file is closed.
void writeFileBytes(const std::string& path, const std::vector<std::string_view>& chunks);

} // namespace rnnc

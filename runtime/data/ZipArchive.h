// The entries of a zip archive, as PyTorch's torch.save writes them: stored, not compressed (its
// archives are zips of a pickle and the tensors' raw storages). The archive comes from outside,
// so every offset and size is checked against its length before anything is read: a truncated
// or malformed archive is a UserError naming the file, never a read past its end. Only the
// directory and headers are read here; an entry's bytes are read by whoever needs them, straight
// into their own memory (a weight file's tensors: no copy of the whole file in between).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>

namespace rnnc {

// Where an archive's bytes come from: a file read piece by piece, or bytes in memory.
class ByteSource {
public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Exactly `count` bytes from `offset`; callers keep within size().
  virtual void read(uint64_t offset, size_t count, char* into) const = 0;
  std::string readString(uint64_t offset, size_t count) const;
};

class MemorySource : public ByteSource {
public:
  explicit MemorySource(std::string_view bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, size_t count, char* into) const override;

private:
  std::string_view bytes_;
};

struct ZipEntry {
  uint64_t offset = 0, size = 0; // of its data in the archive
};

struct ZipEntries {
  std::map<std::string, ZipEntry> stored; // each stored entry, by name
  std::set<std::string> compressed;       // the names of the others (not read here)
};

// The archive's entries. An encrypted entry, an entry named twice and a central directory or
// entry that does not fit the archive are errors naming `path`; ZIP64 sizes and offsets are read.
ZipEntries readZipEntries(const ByteSource& archive, const std::string& path);

// Whether the bytes start as a zip archive does (a local file header).
bool looksLikeZip(std::string_view bytes);

} // namespace rnnc

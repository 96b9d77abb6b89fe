#include "runtime/data/WeightFile.h"

#include "ir/FileIO.h"
#include "runtime/data/TorchCheckpoint.h"
#include "runtime/data/ZipArchive.h"

#include <algorithm>
#include <memory>

namespace rnnc {
namespace {

// A regular file read piece by piece: a torch.save archive's tensors each straight into their
// own memory.
class FileSource : public ByteSource {
public:
  explicit FileSource(const PositionalFile& file) : file_(file) {}
  uint64_t size() const override { return file_.size(); }
  void read(uint64_t offset, size_t count, char* into) const override {
    file_.read(offset, into, count);
  }

private:
  const PositionalFile& file_;
};

} // namespace

TensorMap readWeightFile(const std::string& path, TensorReading reading) {
  std::unique_ptr<PositionalFile> file = PositionalFile::open(path);
  if (!file) { // a pipe: read whole, once
    FileBytes bytes = mapFileBytes(path);
    if (looksLikeTorchCheckpoint(bytes.view()))
      return parseTorchCheckpoint(bytes.view(), path);
    return parseSafeTensors(bytes.view(), path);
  }
  // A safetensors file starts with its header's length, 8 bytes little-endian: the zip
  // signature "PK\3\4" there would say a header of 67 MB or more, and the legacy format's
  // 80 02 8a 0a one of exabytes.
  const FileSource source(*file);
  if (looksLikeTorchCheckpoint(source.readString(0, std::min<uint64_t>(file->size(), 4))))
    return readTorchCheckpoint(source, path);
  return readSafeTensors(path, reading);
}

} // namespace rnnc

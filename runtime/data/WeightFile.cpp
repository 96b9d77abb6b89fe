#include "runtime/data/WeightFile.h"

#include "ir/FileIO.h"
#include "runtime/data/TorchCheckpoint.h"

#include <memory>

namespace rnnc {

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
  char first[4] = {};
  if (file->size() >= 4)
    file->read(0, first, 4);
  if (looksLikeTorchCheckpoint(std::string_view(first, file->size() >= 4 ? 4 : 0)))
    return readTorchCheckpoint(path);
  return readSafeTensors(path, reading);
}

} // namespace rnnc

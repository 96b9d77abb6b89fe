// Reading and writing safetensors files: an 8-byte little-endian header length, a JSON header
// mapping tensor names to {dtype, shape, data_offsets}, then the raw data.
//
// rnnc's weights are float32 (`F32`), or int8 (`I8`) with a `NAME.scale` beside each (F32, one
// scale per row, or one): read as fp32, q * scale. Every malformed file (truncated, bad header
// length, bad JSON, unknown or unsupported dtype, offsets out of range or overlapping, size not
// matching the shape) raises a UserError naming the file and, where there is one, the tensor.
#pragma once

#include "runtime/data/Tensor.h"

#include <map>
#include <string>
#include <string_view>

namespace rnnc {

using TensorMap = std::map<std::string, Tensor>;

// How a file's float32 tensors get their data: copied into memory of their own, or left where
// they lie in the file, mapped privately (PositionalFile::mapPrivately: no copy, no fresh memory
// to zero; the file must then keep its length while the tensors live, as any mapped file).
// In place is for a process that uses the tensors soon and is done (`rnnc run`, `rnnc grad`),
// not for tensors kept while the file may be rewritten. Where mapping costs more than reading
// on the host, or a tensor's data is not aligned for floats, it is copied either way.
enum class TensorReading { copied, inPlace };

TensorMap readSafeTensors(const std::string& path, TensorReading reading = TensorReading::copied);
// The same over a file's bytes in memory; `path` names it in messages.
TensorMap parseSafeTensors(std::string_view bytes, const std::string& path);
void writeSafeTensors(const std::string& path, const TensorMap& tensors);

} // namespace rnnc

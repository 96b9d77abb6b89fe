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

TensorMap readSafeTensors(const std::string& path);
// The same over a file's bytes in memory; `path` names it in messages.
TensorMap parseSafeTensors(std::string_view bytes, const std::string& path);
void writeSafeTensors(const std::string& path, const TensorMap& tensors);

} // namespace rnnc

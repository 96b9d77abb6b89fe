// Reading and writing NumPy `.npy` files (format versions 1.0, 2.0 and 3.0).
//
// rnnc's inputs and outputs are float32, C order; sequence lengths are int64. Every malformed file
// (truncated, bad magic or header, wrong dtype, Fortran order, size mismatch) raises a UserError
// that names the file and says what was expected and what was found.
#pragma once

#include "runtime/data/Tensor.h"

#include <string>
#include <string_view>

namespace rnnc {

Tensor readNpyFloat32(const std::string& path);
Int64Array readNpyInt64(const std::string& path);
// The same over a file's bytes in memory; `path` names it in messages.
Tensor parseNpyFloat32(std::string_view bytes, const std::string& path);
// A float32 file's shape and its data, checked as parseNpyFloat32 checks them but not copied:
// `data` lies inside `bytes` (a mapped file), for a reader that copies it to where it belongs.
struct NpyFloat32View {
  TensorShape shape;
  std::string_view data; // numElements(shape) little-endian floats
};
NpyFloat32View viewNpyFloat32(std::string_view bytes, const std::string& path);
Int64Array parseNpyInt64(std::string_view bytes, const std::string& path);

void writeNpy(const std::string& path, const Tensor& tensor);
void writeNpy(const std::string& path, const Int64Array& array);

} // namespace rnnc

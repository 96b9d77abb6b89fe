#include "runtime/Tensor.h"

#include "ir/Error.h"

namespace rnnc {

std::string shapeToString(const TensorShape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i)
      out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

int64_t numElements(const TensorShape& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

Tensor::Tensor(TensorShape shape, float fill)
    : shape_(std::move(shape)), data_(static_cast<size_t>(numElements(shape_)), fill) {}

Tensor::Tensor(TensorShape shape, std::vector<float> values)
    : shape_(std::move(shape)), data_(std::move(values)) {
  RNNC_INTERNAL_CHECK(static_cast<int64_t>(data_.size()) == numElements(shape_),
                      "tensor data does not match shape " + shapeToString(shape_));
}

Tensor Tensor::reshaped(TensorShape shape) const {
  RNNC_INTERNAL_CHECK(numElements(shape) == numel(),
                      "reshape " + shapeString() + " to " + shapeToString(shape) + " changes size");
  return Tensor(std::move(shape), data_);
}

} // namespace rnnc

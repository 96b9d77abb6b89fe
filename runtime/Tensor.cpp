#include "runtime/Tensor.h"

#include "ir/Error.h"

#include <limits>
#include <new>
#include <string>

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
  for (int64_t d : shape) {
    if (d < 0)
      throw UserError("a tensor shape " + shapeToString(shape) + " with a negative dimension");
    // Elements and their bytes stay within int64_t: every size computed from them is exact.
    if (__builtin_mul_overflow(n, d, &n) || n > std::numeric_limits<int64_t>::max() / 8)
      throw UserError("a tensor of shape " + shapeToString(shape) +
                      " has more elements than memory can hold");
  }
  return n;
}

namespace {

std::vector<float> allocate(const TensorShape& shape, float fill) {
  const int64_t n = numElements(shape);
  try {
    return std::vector<float>(static_cast<size_t>(n), fill);
  } catch (const std::bad_alloc&) {
    throw UserError("out of memory for a tensor of shape " + shapeToString(shape) + " (" +
                    std::to_string(n * static_cast<int64_t>(sizeof(float))) + " bytes)");
  }
}

} // namespace

Tensor::Tensor(TensorShape shape, float fill)
    : shape_(std::move(shape)), data_(allocate(shape_, fill)) {}

Tensor::Tensor(TensorShape shape, std::vector<float> values)
    : shape_(std::move(shape)), data_(std::move(values)) {
  RNNC_INTERNAL_CHECK(static_cast<int64_t>(data_.size()) == numElements(shape_),
                      "tensor data does not match shape " + shapeToString(shape_));
}

Tensor Tensor::reshaped(TensorShape shape) const {
  RNNC_INTERNAL_CHECK(numElements(shape) == numel(),
                      "reshape " + shapeString() + " to " + shapeToString(shape) + " changes size");
  Tensor out(std::move(shape), data_);
  out.source_ = source_;
  return out;
}

std::string describeTensor(const std::string& what, const std::string& source) {
  return source.empty() ? what : what + " (" + source + ")";
}

std::vector<const float*> dataPointers(const std::vector<Tensor>& tensors) {
  std::vector<const float*> result;
  for (const Tensor& t : tensors)
    result.push_back(t.data());
  return result;
}

std::vector<float*> mutableDataPointers(std::vector<Tensor>& tensors) {
  std::vector<float*> result;
  for (Tensor& t : tensors)
    result.push_back(t.data());
  return result;
}

} // namespace rnnc

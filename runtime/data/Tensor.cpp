#include "runtime/data/Tensor.h"

#include "runtime/data/AlignedBuffer.h"

#include "ir/Error.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
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

// `n` elements of `shape`, filled with `fill` unless `fill` is empty.
TensorData allocate(const TensorShape& shape, std::optional<float> fill) {
  const int64_t n = numElements(shape);
  try {
    TensorData data;
    if (fill)
      data.assign(static_cast<size_t>(n), *fill);
    else
      data.resize(static_cast<size_t>(n));
    return data;
  } catch (const std::bad_alloc&) {
    throw UserError("out of memory for a tensor of shape " + shapeToString(shape) + " (" +
                    std::to_string(n * static_cast<int64_t>(sizeof(float))) + " bytes)");
  }
}

} // namespace

void* allocateTensorBytes(size_t bytes) {
  if (isLargeBuffer(bytes))
    return takeLargeBuffer(bytes).data;
  void* memory = std::aligned_alloc(
      kCacheLineBytes,
      std::max<size_t>(1, (bytes + kCacheLineBytes - 1) / kCacheLineBytes) * kCacheLineBytes);
  if (!memory)
    throw std::bad_alloc();
  populateForWriting(memory, bytes); // a tensor is written whole before it is read
  return memory;
}

void freeTensorBytes(void* data, size_t bytes) noexcept {
  if (!data)
    return;
  if (isLargeBuffer(bytes))
    giveLargeBuffer(data, bytes);
  else
    std::free(data);
}

Tensor::Tensor(TensorShape shape, float fill)
    : shape_(std::move(shape)), data_(allocate(shape_, fill)) {}

Tensor::Tensor(TensorShape shape, const std::vector<float>& values)
    : shape_(std::move(shape)), data_(values.begin(), values.end()) {
  RNNC_INTERNAL_CHECK(static_cast<int64_t>(data_.size()) == numElements(shape_),
                      "tensor data does not match shape " + shapeToString(shape_));
}

Tensor::Tensor(TensorShape shape, TensorData values)
    : shape_(std::move(shape)), data_(std::move(values)) {
  RNNC_INTERNAL_CHECK(static_cast<int64_t>(data_.size()) == numElements(shape_),
                      "tensor data does not match shape " + shapeToString(shape_));
}

Tensor Tensor::uninitialized(TensorShape shape) {
  Tensor t;
  t.data_ = allocate(shape, std::nullopt);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::ofBytes(TensorShape shape, std::string_view bytes) {
  Tensor tensor = uninitialized(std::move(shape));
  RNNC_INTERNAL_CHECK(static_cast<size_t>(tensor.numel()) * sizeof(float) == bytes.size(),
                      "tensor bytes do not match its shape");
  // memcpy with a null (empty tensor) destination is UB even for zero bytes.
  if (!bytes.empty())
    std::memcpy(tensor.data(), bytes.data(), bytes.size());
  return tensor;
}

Tensor Tensor::borrowing(TensorShape shape, BorrowedFloats floats) {
  const int64_t n = numElements(shape);
  RNNC_INTERNAL_CHECK(n >= 0 && static_cast<size_t>(n) == floats.count,
                      "borrowed floats do not match shape " + shapeToString(shape));
  Tensor tensor;
  tensor.shape_ = std::move(shape);
  // The allocator hands out the borrowed floats for this size, and the resize leaves them as
  // they are (TensorAllocator default-initialises).
  tensor.data_ = TensorData(TensorAllocator<float>(std::move(floats)));
  tensor.data_.resize(static_cast<size_t>(n));
  return tensor;
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

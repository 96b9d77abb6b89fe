// A dense, contiguous, row-major float32 tensor owned by value. This is what the runtime reads from
// files, hands to the interpreter and writes back; it favours clarity over clever storage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rnnc {

using TensorShape = std::vector<int64_t>;

std::string shapeToString(const TensorShape& shape); // "[3, 4]"
int64_t numElements(const TensorShape& shape);

class Tensor {
public:
  Tensor() = default;
  explicit Tensor(TensorShape shape, float fill = 0.0f);
  Tensor(TensorShape shape, std::vector<float> values); // values.size() must match the shape

  const TensorShape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_.at(static_cast<size_t>(i)); }
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }
  std::string shapeString() const { return shapeToString(shape_); }

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  std::vector<float>& values() { return data_; }
  const std::vector<float>& values() const { return data_; }

  // Same data, new shape with the same element count.
  Tensor reshaped(TensorShape shape) const;

  // Where the values were read from (a file's path), or empty: shape errors name it.
  const std::string& source() const { return source_; }
  void setSource(std::string source) { source_ = std::move(source); }

private:
  TensorShape shape_;
  std::vector<float> data_;
  std::string source_;
};

// Each tensor's data, in order: the pointer arrays generated code reads (RunArgs.h).
std::vector<const float*> dataPointers(const std::vector<Tensor>& tensors);
std::vector<float*> mutableDataPointers(std::vector<Tensor>& tensors);

// A dense int64 array, used for sequence lengths.
struct Int64Array {
  TensorShape shape;
  std::vector<int64_t> values;
  std::string source = {}; // where it was read from, or empty
};

// `what` and, when it was read from a file, the file: "initial state 'h' (h0.npy)".
std::string describeTensor(const std::string& what, const std::string& source);
inline std::string describeTensor(const std::string& what, const Tensor& tensor) {
  return describeTensor(what, tensor.source());
}

} // namespace rnnc

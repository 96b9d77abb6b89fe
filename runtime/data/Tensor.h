// A dense, contiguous, row-major float32 tensor owned by value. This is what the runtime reads from
// files, hands to the interpreter and writes back; it favours clarity over clever storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace rnnc {

using TensorShape = std::vector<int64_t>;

// Memory for tensor data. Buffers of 2 MB and more are mapped on a 2 MB boundary and advised
// onto huge pages (MADV_HUGEPAGE; Linux's transparent huge pages are often "madvise" only): a
// training step's tensors of tens of megabytes, freshly allocated, then cost tens of page faults
// instead of thousands (malloc maps anything past 32 MB on 4 KB pages, and in a VM each fault
// costs microseconds: a quarter of an LSTM training step went to them); freed, they are kept
// for the next buffer of their size (runtime/data/AlignedBuffer.h, takeLargeBuffer). Contents
// unspecified. Buffers from 128 KB to 2 MB are kept and reused alike (malloc's memory).
void* allocateTensorBytes(size_t bytes);
void freeTensorBytes(void* data, size_t bytes) noexcept;

// Floats a tensor's data may stay in rather than be copied to memory of its own: a mapped
// file's pages (readSafeTensors with TensorReading::inPlace), private to this process (a write
// copies the page it writes). `owner` keeps them valid while any tensor uses them.
struct BorrowedFloats {
  std::shared_ptr<const void> owner;
  float* data = nullptr;
  size_t count = 0;
};

// std::vector's allocator for tensor data: the memory above, and elements default-initialised
// (a resize leaves floats unwritten), so that a tensor made to be overwritten is not zeroed
// first; Tensor's constructors fill explicitly. An allocator given borrowed floats hands them
// out for a vector of their size (Tensor::borrowing) and frees everything else as usual; it
// moves and swaps with the data it holds, and a copy of the vector owns its memory.
template <class T> struct TensorAllocator {
  using value_type = T;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::false_type;
  TensorAllocator() = default;
  explicit TensorAllocator(BorrowedFloats floats) : borrowed(std::move(floats)) {}
  template <class U>
  TensorAllocator(const TensorAllocator<U>& other) noexcept : borrowed(other.borrowed) {}
  TensorAllocator select_on_container_copy_construction() const { return {}; }
  T* allocate(size_t n) {
    if (borrowed.data && n * sizeof(T) == borrowed.count * sizeof(float))
      return reinterpret_cast<T*>(borrowed.data);
    return static_cast<T*>(allocateTensorBytes(n * sizeof(T)));
  }
  void deallocate(T* data, size_t n) noexcept {
    if (static_cast<void*>(data) != static_cast<void*>(borrowed.data))
      freeTensorBytes(data, n * sizeof(T));
  }
  template <class U, class... Args> void construct(U* at, Args&&... args) {
    if constexpr (sizeof...(Args) == 0)
      ::new (static_cast<void*>(at)) U;
    else
      ::new (static_cast<void*>(at)) U(std::forward<Args>(args)...);
  }
  // Each can free what the other allocated only where neither borrows, or both the same.
  template <class U> bool operator==(const TensorAllocator<U>& other) const noexcept {
    return borrowed.data == other.borrowed.data;
  }

  BorrowedFloats borrowed;
};

using TensorData = std::vector<float, TensorAllocator<float>>;

std::string shapeToString(const TensorShape& shape); // "[3, 4]"
int64_t numElements(const TensorShape& shape);

class Tensor {
public:
  Tensor() = default;
  explicit Tensor(TensorShape shape, float fill = 0.0f);
  Tensor(TensorShape shape, const std::vector<float>& values); // values.size() must match
  Tensor(TensorShape shape, TensorData values);
  // A tensor whose every element the caller writes before reading it: not filled.
  static Tensor uninitialized(TensorShape shape);
  // A tensor of `shape` holding the little-endian floats `bytes` (numel * 4 of them), copied
  // once into memory not filled first: what the file readers make of a file's data.
  static Tensor ofBytes(TensorShape shape, std::string_view bytes);
  // A tensor of `shape` whose data are `floats` where they lie (as many as the shape has),
  // kept valid by their owner while this tensor or one moved from it holds them; a copy owns
  // its data.
  static Tensor borrowing(TensorShape shape, BorrowedFloats floats);

  const TensorShape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_.at(static_cast<size_t>(i)); }
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }
  std::string shapeString() const { return shapeToString(shape_); }

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  TensorData& values() { return data_; }
  const TensorData& values() const { return data_; }

  // Same data, new shape with the same element count.
  Tensor reshaped(TensorShape shape) const;

  // Where the values were read from (a file's path), or empty: shape errors name it.
  const std::string& source() const { return source_; }
  void setSource(std::string source) { source_ = std::move(source); }

private:
  TensorShape shape_;
  TensorData data_;
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

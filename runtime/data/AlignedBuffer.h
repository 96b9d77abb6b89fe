// Scratch memory for generated code: floats that start on a cache line, and, for buffers of a
// few megabytes (packed weights, the input projection's rows), on 2 MB pages where the kernel
// gives them (madvise MADV_HUGEPAGE; Linux's transparent huge pages are often "madvise" only).
// A tile of the input GEMM touches a line in each of some hundred 4 KB pages at once (its rows
// of x, of the output and the weights' panel); on 4 KB pages that overflows the first-level
// data TLB.
#pragma once

#include "ir/HugePages.h"

#include <cstddef>
#include <cstdint>

namespace rnnc {

// A cache line; large buffers (these, and tensors: runtime/data/Tensor.h) start on a huge page
// (ir/HugePages.h).
inline constexpr size_t kCacheLineBytes = 64;

// Makes the pages of a buffer about to be written present, in one call (MADV_POPULATE_WRITE)
// rather than a page fault per 4 KB page on first touch: in a VM a fault costs microseconds (a
// megabyte of fresh heap memory written took 3.6 ms in faults, 1.2 ms populated first). Pages
// already present are left as they are, so a buffer reused from the heap costs a page-table
// walk. Buffers under 64 KB, and kernels without the call, fault as before.
void populateForWriting(void* data, size_t bytes) noexcept;

class AlignedBuffer {
public:
  AlignedBuffer() = default;
  // `floats` floats, zero.
  explicit AlignedBuffer(int64_t floats);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  float* data() const { return data_; }
  int64_t size() const { return floats_; }

private:
  void release();
  float* data_ = nullptr;
  int64_t floats_ = 0;
};

} // namespace rnnc

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

// A cache line; buffers of 2 MB and more (these, and tensors: runtime/data/Tensor.h) start on a
// huge page (ir/HugePages.h).
inline constexpr size_t kCacheLineBytes = 64;

// Makes the pages of a buffer about to be written present, in one call (MADV_POPULATE_WRITE)
// rather than a page fault per 4 KB page on first touch: in a VM a fault costs microseconds (a
// megabyte of fresh heap memory written took 3.6 ms in faults, 1.2 ms populated first). Pages
// already present are left as they are, so a buffer reused from the heap costs a page-table
// walk. Buffers under 64 KB, and kernels without the call, fault as before.
void populateForWriting(void* data, size_t bytes) noexcept;

// Buffers of 128 KB and more (AlignedBuffer's, tensors') come from the large buffers below,
// reused; smaller ones from malloc. glibc maps each buffer of such a size afresh and unmaps it
// when it is freed, and fresh memory costs its page faults again, in a VM the hypervisor's too:
// an LSTM's backward over one step (H=256, batch 1), three 1 MB gradients allocated and zeroed,
// took 2.1-2.9 ms on malloc's memory and 0.16-0.22 ms on reused buffers (Zen 5 VM).
inline constexpr size_t kLargeBufferBytes = size_t{128} << 10;
inline bool isLargeBuffer(size_t bytes) {
  return bytes >= kLargeBufferBytes;
}

// Memory of `bytes` rounded up to whole huge pages (ir/HugePages.h) from 2 MB on, from the
// buffers of that size given back before (`fresh` false: it holds what was written there) or
// freshly mapped (`fresh`: it reads as zero); below 2 MB, whole cache lines of malloc's memory,
// given back into the same cache rather than freed (`fresh` always false). Tensors' large data and
// AlignedBuffer's come from here, so that a training step that allocates and frees the same sizes
// at every call meets no page faults after its first. Given back with giveLargeBuffer(data, the
// same bytes), which keeps it for the next taker (up to a limit, a gigabyte unless set below; the
// oldest unmapped first).
struct LargeBuffer {
  void* data;
  bool fresh;
};
LargeBuffer takeLargeBuffer(size_t bytes);
void giveLargeBuffer(void* data, size_t bytes) noexcept;

// The buffers given back and kept: their bytes; unmapping them all now (the bytes returned to
// the system); the most kept (a gigabyte unless set; setting it unmaps the oldest beyond it,
// returning their bytes, and 0 keeps none). The public API's cachedMemoryBytes() and the
// rest (include/rnnc/rnnc.h), for an application that wants the memory back.
size_t cachedLargeBufferBytes();
size_t releaseCachedLargeBuffers();
size_t setCachedLargeBufferLimit(size_t bytes);
size_t cachedLargeBufferLimit();

class AlignedBuffer {
public:
  AlignedBuffer() = default;
  // `floats` floats, zero.
  explicit AlignedBuffer(int64_t floats);
  // `floats` floats of unspecified value, for a buffer written before it is read (a GEMM's
  // packed panels, the generated code's workspace): reused memory is not cleared.
  static AlignedBuffer uninitialized(int64_t floats);
  // Under AddressSanitizer (the sanitizer test run) they are NaN instead: code that reads a
  // float it did not write first then shows as a wrong result in every test, where fresh
  // memory's zeros or the last run's values could pass.
#if defined(__SANITIZE_ADDRESS__) || defined(RNNC_POISON_UNINITIALIZED)
  static constexpr bool kPoisonsUninitialized = true;
#else
  static constexpr bool kPoisonsUninitialized = false;
#endif
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  float* data() const {
    return data_;
  }
  int64_t size() const {
    return floats_;
  }

private:
  AlignedBuffer(int64_t floats, bool zero);
  void release();
  float* data_ = nullptr;
  int64_t floats_ = 0;
};

} // namespace rnnc

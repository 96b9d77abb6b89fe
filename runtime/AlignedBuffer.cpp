#include "runtime/AlignedBuffer.h"

#include "ir/Error.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <sys/mman.h>
#include <utility>

namespace rnnc {
AlignedBuffer::AlignedBuffer(int64_t floats) : floats_(floats) {
  RNNC_INTERNAL_CHECK(floats >= 0, "negative buffer size");
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (bytes == 0)
    return;
  if (bytes >= kHugePageBytes) {
    // Map a huge page more than needed and use it from its first 2 MB boundary, so that every
    // 2 MB of the buffer can be one page.
    mappedBytes_ = bytes + kHugePageBytes;
    void* mapping =
        mmap(nullptr, mappedBytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED)
      throw std::bad_alloc();
    mapping_ = mapping;
    auto address = reinterpret_cast<std::uintptr_t>(mapping);
    auto* aligned =
        reinterpret_cast<char*>((address + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes);
    // Advice only: where huge pages are off, the buffer is on 4 KB pages and still works.
    (void)madvise(aligned, (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes,
                  MADV_HUGEPAGE);
    data_ = reinterpret_cast<float*>(aligned); // anonymous memory reads as zero
    return;
  }
  void* memory = std::aligned_alloc(kCacheLineBytes, (bytes + kCacheLineBytes - 1) /
                                                         kCacheLineBytes * kCacheLineBytes);
  if (!memory)
    throw std::bad_alloc();
  std::memset(memory, 0, bytes);
  data_ = static_cast<float*>(memory);
}

AlignedBuffer::~AlignedBuffer() {
  release();
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), floats_(std::exchange(other.floats_, 0)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mappedBytes_(std::exchange(other.mappedBytes_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    floats_ = std::exchange(other.floats_, 0);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mappedBytes_ = std::exchange(other.mappedBytes_, 0);
  }
  return *this;
}

void AlignedBuffer::release() {
  if (mapping_)
    munmap(mapping_, mappedBytes_);
  else
    std::free(data_);
  data_ = nullptr;
  mapping_ = nullptr;
  floats_ = 0;
  mappedBytes_ = 0;
}

} // namespace rnnc

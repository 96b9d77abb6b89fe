#include "runtime/data/AlignedBuffer.h"

#include "ir/Error.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sys/mman.h>
#include <utility>

namespace rnnc {
namespace {

bool mapped(size_t bytes) {
  return bytes >= kHugePageBytes;
}

} // namespace

void populateForWriting(void* data, size_t bytes) noexcept {
  constexpr size_t kPage = 4096, kWorthIt = size_t{64} << 10;
  if (bytes < kWorthIt)
    return;
  // The whole pages inside the buffer: the pages at its ends may hold other allocations.
  const auto first = (reinterpret_cast<std::uintptr_t>(data) + kPage - 1) / kPage * kPage;
  const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes) / kPage * kPage;
#ifdef MADV_POPULATE_WRITE
  if (end > first)
    (void)madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_WRITE);
#else
  (void)first;
  (void)end;
#endif
}

AlignedBuffer::AlignedBuffer(int64_t floats) : floats_(floats) {
  RNNC_INTERNAL_CHECK(floats >= 0, "negative buffer size");
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (bytes == 0)
    return;
  if (mapped(bytes)) {
    data_ = static_cast<float*>(mapHugePages(bytes)); // anonymous memory reads as zero
    return;
  }
  void* memory = std::aligned_alloc(kCacheLineBytes, (bytes + kCacheLineBytes - 1) /
                                                         kCacheLineBytes * kCacheLineBytes);
  if (!memory)
    throw std::bad_alloc();
  populateForWriting(memory, bytes);
  std::memset(memory, 0, bytes);
  data_ = static_cast<float*>(memory);
}

AlignedBuffer::~AlignedBuffer() {
  release();
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), floats_(std::exchange(other.floats_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    floats_ = std::exchange(other.floats_, 0);
  }
  return *this;
}

void AlignedBuffer::release() {
  const size_t bytes = static_cast<size_t>(floats_) * sizeof(float);
  if (data_ && mapped(bytes))
    unmapHugePages(data_, bytes);
  else
    std::free(data_);
  data_ = nullptr;
  floats_ = 0;
}

} // namespace rnnc

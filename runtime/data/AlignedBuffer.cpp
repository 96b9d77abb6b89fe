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

void* mapHugePages(size_t bytes) {
  // Map a huge page more than needed, then unmap what lies before the first 2 MB boundary and
  // after the buffer's last huge page: what is left starts on the boundary, and its size follows
  // from `bytes` alone when it is unmapped.
  const size_t used = wholeHugePages(bytes), mappedBytes = used + kHugePageBytes;
  void* mapping =
      mmap(nullptr, mappedBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED)
    throw std::bad_alloc();
  auto* begin = static_cast<char*>(mapping);
  auto* aligned =
      reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(begin) + kHugePageBytes - 1) /
                              kHugePageBytes * kHugePageBytes);
  if (aligned > begin)
    munmap(begin, static_cast<size_t>(aligned - begin));
  if (begin + mappedBytes > aligned + used)
    munmap(aligned + used, static_cast<size_t>(begin + mappedBytes - (aligned + used)));
  (void)madvise(aligned, used, MADV_HUGEPAGE);
  return aligned;
}

void unmapHugePages(void* data, size_t bytes) noexcept {
  munmap(data, wholeHugePages(bytes));
}

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

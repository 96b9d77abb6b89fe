#include "runtime/data/AlignedBuffer.h"

#include "ir/Error.h"
#include "runtime/threads/ForkSafety.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <sys/mman.h>
#include <utility>
#include <vector>

namespace rnnc {
namespace {

// Large buffers freed, kept for the next buffer of the same size: a training step allocates
// the same tensors of tens of megabytes every call, and the weight gradients' GEMMs their
// packed panels, and fresh memory costs its page faults and the kernel's zeroing again (LSTM
// T=100 B=64 H=512, forward and backward on one thread: 512 ms with glibc's malloc, 546 ms
// freshly mapped on huge pages, 2200 ms on 4 KB pages, in a VM where a fault costs
// microseconds). At most limit() bytes are kept (kDefaultLimit unless changed); the oldest go
// first.
class LargeBufferCache {
public:
  static constexpr size_t kDefaultLimit = size_t{1} << 30;

  void* take(size_t used) {
    std::lock_guard lock(mutex_);
    for (auto it = buffers_.rbegin(); it != buffers_.rend(); ++it)
      if (it->bytes == used) {
        void* data = it->data;
        cached_ -= used;
        buffers_.erase(std::next(it).base());
        return data;
      }
    return nullptr;
  }

  void give(void* data, size_t used) {
    std::vector<Buffer> evicted;
    {
      std::lock_guard lock(mutex_);
      buffers_.push_back({data, used});
      cached_ += used;
      evicted = evictDownTo(limit_);
    }
    unmap(evicted);
  }

  // Unmaps the oldest buffers until at most `bytes` are kept, and keeps no more from now on.
  size_t setLimit(size_t bytes) {
    std::vector<Buffer> evicted;
    {
      std::lock_guard lock(mutex_);
      limit_ = bytes;
      evicted = evictDownTo(limit_);
    }
    return unmap(evicted);
  }

  // Unmaps every buffer kept; the limit stays.
  size_t release() {
    std::vector<Buffer> evicted;
    {
      std::lock_guard lock(mutex_);
      evicted = evictDownTo(0);
    }
    return unmap(evicted);
  }

  size_t bytes() {
    std::lock_guard lock(mutex_);
    return cached_;
  }

  size_t limit() {
    std::lock_guard lock(mutex_);
    return limit_;
  }

private:
  struct Buffer {
    void* data;
    size_t bytes;
  };

  std::vector<Buffer> evictDownTo(size_t bytes) { // with mutex_ held
    std::vector<Buffer> evicted;
    while (cached_ > bytes) {
      evicted.push_back(buffers_.front());
      cached_ -= buffers_.front().bytes;
      buffers_.erase(buffers_.begin());
    }
    return evicted;
  }

  // Outside the lock: munmap can take a while, and other threads may be taking buffers.
  static size_t unmap(const std::vector<Buffer>& buffers) {
    size_t bytes = 0;
    for (const Buffer& b : buffers) {
      if (b.bytes >= kHugePageBytes)
        unmapHugePages(b.data, b.bytes);
      else
        std::free(b.data); // malloc's (takeLargeBuffer)
      bytes += b.bytes;
    }
    return bytes;
  }

  std::mutex mutex_;
  HeldAcrossFork forkHold_{mutex_}; // the process has one (largeBuffers()): a child finds it whole
  std::vector<Buffer> buffers_;     // oldest first
  size_t cached_ = 0;
  size_t limit_ = kDefaultLimit;
};

LargeBufferCache& largeBuffers() {
  static auto* cache = new LargeBufferCache; // never destroyed: buffers may outlive statics
  return *cache;
}

// What a large buffer of `bytes` takes: whole huge pages from a huge page on; below, whole cache
// lines of malloc's memory.
size_t usedBytes(size_t bytes) {
  return bytes >= kHugePageBytes
             ? wholeHugePages(bytes)
             : (bytes + kCacheLineBytes - 1) / kCacheLineBytes * kCacheLineBytes;
}

} // namespace

LargeBuffer takeLargeBuffer(size_t bytes) {
  const size_t used = usedBytes(bytes);
  if (void* reused = largeBuffers().take(used))
    return {reused, false};
  if (used >= kHugePageBytes)
    return {mapHugePages(used), true};
  // Under a huge page, malloc's memory as before (from the heap where a program keeps freed
  // blocks there, as the rnnc tool does), kept when given back rather than freed.
  void* memory = std::aligned_alloc(kCacheLineBytes, used);
  if (!memory)
    throw std::bad_alloc();
  populateForWriting(memory, used);
  return {memory, false};
}

void giveLargeBuffer(void* data, size_t bytes) noexcept {
  largeBuffers().give(data, usedBytes(bytes));
}

size_t cachedLargeBufferBytes() {
  return largeBuffers().bytes();
}

size_t releaseCachedLargeBuffers() {
  return largeBuffers().release();
}

size_t setCachedLargeBufferLimit(size_t bytes) {
  return largeBuffers().setLimit(bytes);
}

size_t cachedLargeBufferLimit() {
  return largeBuffers().limit();
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

AlignedBuffer::AlignedBuffer(int64_t floats) : AlignedBuffer(floats, true) {}

AlignedBuffer AlignedBuffer::uninitialized(int64_t floats) {
  AlignedBuffer buffer(floats, false);
  if (kPoisonsUninitialized)
    std::fill(buffer.data(), buffer.data() + floats, std::numeric_limits<float>::quiet_NaN());
  return buffer;
}

AlignedBuffer::AlignedBuffer(int64_t floats, bool zero) : floats_(floats) {
  RNNC_INTERNAL_CHECK(floats >= 0, "negative buffer size");
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (bytes == 0)
    return;
  if (isLargeBuffer(bytes)) {
    const LargeBuffer buffer = takeLargeBuffer(bytes);
    if (zero && !buffer.fresh) // fresh anonymous memory reads as zero
      std::memset(buffer.data, 0, bytes);
    data_ = static_cast<float*>(buffer.data);
    return;
  }
  void* memory = std::aligned_alloc(kCacheLineBytes, (bytes + kCacheLineBytes - 1) /
                                                         kCacheLineBytes * kCacheLineBytes);
  if (!memory)
    throw std::bad_alloc();
  populateForWriting(memory, bytes);
  if (zero)
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
  if (data_ && isLargeBuffer(bytes))
    giveLargeBuffer(data_, bytes);
  else
    std::free(data_);
  data_ = nullptr;
  floats_ = 0;
}

} // namespace rnnc

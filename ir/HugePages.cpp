#include "ir/HugePages.h"

#include <cstdint>
#include <new>
#include <sys/mman.h>

namespace rnnc {

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
  adviseHugePages(aligned, used);
  return aligned;
}

void unmapHugePages(void* data, size_t bytes) noexcept {
  munmap(data, wholeHugePages(bytes));
}

void adviseHugePages(void* data, size_t bytes) noexcept {
  const auto start = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t first = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const std::uintptr_t end = (start + bytes) / kHugePageBytes * kHugePageBytes;
  if (end > first)
    (void)madvise(reinterpret_cast<void*>(first), end - first, MADV_HUGEPAGE);
}

} // namespace rnnc

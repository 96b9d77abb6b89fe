// Memory on 2 MB pages where the kernel gives them (transparent huge pages on advice,
// MADV_HUGEPAGE: Linux's are often "madvise" only): one page fault per 2 MB rather than one per
// 4 KB page, and fewer TLB entries. A fault costs microseconds in a VM. Used by the tensors and
// the generated code's buffers (runtime/data/AlignedBuffer.h), large file reads (ir/FileIO.h)
// and the rnnc tool's heap. Advice only: where huge pages are off, 4 KB pages work the same.
#pragma once

#include <cstddef>

namespace rnnc {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

inline size_t wholeHugePages(size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

// Memory for a large buffer: `bytes` rounded up to whole huge pages, mapped on a 2 MB boundary
// and advised onto huge pages; fresh mappings read as zero. Throws std::bad_alloc when the
// mapping fails. Freed with unmapHugePages(data, the same bytes).
void* mapHugePages(size_t bytes);
void unmapHugePages(void* data, size_t bytes) noexcept;

// Advises the whole huge pages inside [data, data + bytes) onto huge pages (memory already
// mapped, such as the heap's); the partial pages at the ends are left as they are.
void adviseHugePages(void* data, size_t bytes) noexcept;

} // namespace rnnc

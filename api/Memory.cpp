// The public C++ API's control of the memory rnnc keeps for reuse (include/rnnc/rnnc.h), over
// the cache of large buffers (runtime/data/AlignedBuffer.h).
#include "rnnc/rnnc.h"
#include "runtime/data/AlignedBuffer.h"

namespace rnnc {

size_t cachedMemoryBytes() {
  return cachedLargeBufferBytes();
}

size_t releaseCachedMemory() {
  return releaseCachedLargeBuffers();
}

size_t cachedMemoryLimit() {
  return cachedLargeBufferLimit();
}

size_t setCachedMemoryLimit(size_t bytes) {
  return setCachedLargeBufferLimit(bytes);
}

} // namespace rnnc

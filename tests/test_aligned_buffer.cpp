// runtime/data/AlignedBuffer.h: the generated code's scratch memory starts on a cache line (large
// buffers on a 2 MB boundary, where huge pages can back them), reads as zero and moves.
#include "runtime/data/AlignedBuffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

namespace rnnc {
namespace {

std::uintptr_t address(const AlignedBuffer& buffer) {
  return reinterpret_cast<std::uintptr_t>(buffer.data());
}

TEST(AlignedBuffer, SmallAndLargeStartOnTheirBoundariesAndReadZero) {
  for (int64_t floats : {1, 15, 1000, 1 << 19, (1 << 20) + 3}) {
    AlignedBuffer buffer(floats);
    ASSERT_EQ(buffer.size(), floats);
    EXPECT_EQ(address(buffer) % 64, 0u) << floats;
    if (floats * 4 >= (2 << 20)) {
      EXPECT_EQ(address(buffer) % (2 << 20), 0u) << floats;
    }
    for (int64_t i = 0; i < floats; i += 997)
      EXPECT_EQ(buffer.data()[i], 0.0f);
    buffer.data()[floats - 1] = 1.0f; // the whole size is writable (ASan checks the small ones)
  }
}

TEST(AlignedBuffer, MovesOwnership) {
  AlignedBuffer a(1 << 20);
  a.data()[5] = 3.0f;
  float* data = a.data();
  AlignedBuffer b(std::move(a));
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(a.data(), nullptr);
  AlignedBuffer c(10);
  c = std::move(b);
  EXPECT_EQ(c.data()[5], 3.0f);
  EXPECT_EQ(c.size(), 1 << 20);
  EXPECT_EQ(AlignedBuffer().data(), nullptr);
}

} // namespace
} // namespace rnnc

// runtime/data/AlignedBuffer.h: the generated code's scratch memory starts on a cache line (large
// buffers on a 2 MB boundary, where huge pages can back them), reads as zero and moves.
#include "runtime/data/AlignedBuffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

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

// Populating a range makes its pages present and changes no byte: not its own (a heap buffer
// reused holds data), nor its neighbours' on the pages it shares at either end.
TEST(AlignedBuffer, PopulatingForWritingKeepsEveryByte) {
  std::vector<unsigned char> memory((size_t{1} << 20) + 8192);
  for (size_t i = 0; i < memory.size(); ++i)
    memory[i] = static_cast<unsigned char>(i * 7 + 3);
  for (size_t offset : {size_t{0}, size_t{1}, size_t{4095}, size_t{4097}})
    for (size_t bytes : {size_t{100}, size_t{65536}, size_t{300001}, size_t{1} << 20})
      populateForWriting(memory.data() + offset, bytes);
  for (size_t i = 0; i < memory.size(); ++i)
    ASSERT_EQ(memory[i], static_cast<unsigned char>(i * 7 + 3)) << i;
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

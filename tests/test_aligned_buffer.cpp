// runtime/data/AlignedBuffer.h: the generated code's scratch memory starts on a cache line (large
// buffers on a 2 MB boundary, where huge pages can back them), reads as zero and moves; large
// buffers freed are given to the next of their size, cleared unless asked for uninitialized.
#include "runtime/data/AlignedBuffer.h"

#include <gtest/gtest.h>

#include <cmath>
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

// A size no other test allocates, so that the cache holds no buffer of it when this starts.
constexpr int64_t kOddLargeFloats = (int64_t{5} << 20) / 4 + 12345;

TEST(AlignedBuffer, ALargeBufferFreedIsReusedAndReadsZeroAgain) {
  float* first = nullptr;
  {
    AlignedBuffer buffer(kOddLargeFloats);
    first = buffer.data();
    for (int64_t i = 0; i < kOddLargeFloats; i += 1000)
      buffer.data()[i] = 7.0f;
  }
  AlignedBuffer again(kOddLargeFloats);
  EXPECT_EQ(again.data(), first) << "the freed buffer of the same size was not reused";
  for (int64_t i = 0; i < kOddLargeFloats; i += 1000)
    ASSERT_EQ(again.data()[i], 0.0f) << i;
}

TEST(AlignedBuffer, AnUninitializedLargeBufferReusesMemoryWithoutClearingIt) {
  const int64_t floats = kOddLargeFloats + 1; // the same huge pages as the test above
  float* first = nullptr;
  {
    AlignedBuffer buffer = AlignedBuffer::uninitialized(floats);
    first = buffer.data();
    buffer.data()[floats - 1] = 5.0f;
  }
  AlignedBuffer again = AlignedBuffer::uninitialized(floats);
  EXPECT_EQ(again.data(), first);
  if (AlignedBuffer::kPoisonsUninitialized) // the sanitizer build
    EXPECT_TRUE(std::isnan(again.data()[floats - 1]));
  else
    EXPECT_EQ(again.data()[floats - 1], 5.0f) << "reused memory was cleared (it need not be)";
  AlignedBuffer third = AlignedBuffer::uninitialized(floats); // the cache has none left: fresh
  EXPECT_NE(third.data(), first);
  EXPECT_EQ(address(third) % (2 << 20), 0u);
}

TEST(AlignedBuffer, LargeBuffersAreFreshUntilOneOfTheirSizeIsGivenBack) {
  // Rounded up to 58 MB (29 huge pages), a size nothing else here allocates: none is cached.
  const size_t bytes = (size_t{57} << 20) + 3, whole = size_t{58} << 20;
  LargeBuffer a = takeLargeBuffer(bytes);
  LargeBuffer b = takeLargeBuffer(bytes);
  EXPECT_TRUE(a.fresh);
  EXPECT_TRUE(b.fresh);
  EXPECT_NE(a.data, b.data);
  static_cast<char*>(a.data)[whole - 1] = 1; // the whole huge pages are usable
  giveLargeBuffer(a.data, bytes);
  LargeBuffer c = takeLargeBuffer(whole); // the same whole pages
  EXPECT_FALSE(c.fresh);
  EXPECT_EQ(c.data, a.data);
  giveLargeBuffer(b.data, bytes);
  giveLargeBuffer(c.data, bytes);
}

// From 128 KB to 2 MB, buffers are kept and reused too, by their cache lines (not a whole huge
// page each): glibc mapped and unmapped each afresh, and a one-step backward's three 1 MB
// gradients cost it milliseconds of page faults per call.
TEST(AlignedBuffer, BuffersUnderAHugePageAreKeptAndReusedBySize) {
  const size_t bytes = (size_t{700} << 10) + 3, whole = (size_t{700} << 10) + 64; // only here
  EXPECT_FALSE(isLargeBuffer(kLargeBufferBytes - 1));
  EXPECT_TRUE(isLargeBuffer(bytes));
  LargeBuffer a = takeLargeBuffer(bytes);
  EXPECT_FALSE(a.fresh); // malloc's memory: not known to be zero
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data) % 64, 0u);
  static_cast<char*>(a.data)[whole - 1] = 1; // the whole last line is usable
  const size_t before = cachedLargeBufferBytes();
  giveLargeBuffer(a.data, bytes);
  EXPECT_EQ(cachedLargeBufferBytes(), before + whole);
  LargeBuffer b = takeLargeBuffer(whole - 10); // the same lines
  EXPECT_EQ(b.data, a.data);
  EXPECT_EQ(static_cast<char*>(b.data)[whole - 1], 1);
  giveLargeBuffer(b.data, bytes);
  // A zeroed buffer of that size takes it, and reads zero.
  const auto floats = static_cast<int64_t>(whole / sizeof(float));
  AlignedBuffer zeroed(floats);
  EXPECT_EQ(zeroed.data(), a.data);
  EXPECT_EQ(zeroed.data()[floats - 1], 0.0f);
}

// Restores the cache's limit however a test ends.
struct LimitRestorer {
  size_t limit = cachedLargeBufferLimit();
  ~LimitRestorer() { setCachedLargeBufferLimit(limit); }
};

TEST(AlignedBuffer, ReleasingTheCacheUnmapsWhatItKeptAndTheNextBufferIsFresh) {
  const size_t bytes = (size_t{61} << 20) + 5, whole = size_t{62} << 20; // only this test's
  LargeBuffer a = takeLargeBuffer(bytes);
  static_cast<char*>(a.data)[0] = 1;
  const size_t before = cachedLargeBufferBytes();
  giveLargeBuffer(a.data, bytes);
  EXPECT_EQ(cachedLargeBufferBytes(), before + whole);
  EXPECT_GE(releaseCachedLargeBuffers(), whole);
  EXPECT_EQ(cachedLargeBufferBytes(), 0u);
  LargeBuffer b = takeLargeBuffer(bytes);
  EXPECT_TRUE(b.fresh) << "a buffer was handed out of the cache after it was released";
  EXPECT_EQ(static_cast<char*>(b.data)[0], 0);
  giveLargeBuffer(b.data, bytes);
}

TEST(AlignedBuffer, TheCacheKeepsTheNewestBuffersWithinItsLimitAndNoneAtZero) {
  LimitRestorer restorer;
  releaseCachedLargeBuffers();
  const size_t page = kHugePageBytes;
  // Three buffers of different sizes given back oldest first; a limit of the two newest.
  std::vector<LargeBuffer> taken;
  for (size_t pages : {3, 4, 5})
    taken.push_back(takeLargeBuffer(pages * page));
  EXPECT_EQ(setCachedLargeBufferLimit(9 * page), 0u);
  EXPECT_EQ(cachedLargeBufferLimit(), 9 * page);
  for (size_t i = 0; i < taken.size(); ++i)
    giveLargeBuffer(taken[i].data, (3 + i) * page);
  EXPECT_EQ(cachedLargeBufferBytes(), 9 * page) << "the oldest (3 pages) should have gone";
  LargeBuffer oldest = takeLargeBuffer(3 * page);
  EXPECT_TRUE(oldest.fresh);
  LargeBuffer newest = takeLargeBuffer(5 * page);
  EXPECT_FALSE(newest.fresh);
  EXPECT_EQ(newest.data, taken[2].data);
  giveLargeBuffer(newest.data, 5 * page);
  // A lower limit lets the oldest go at once; zero keeps nothing given back from then on.
  EXPECT_EQ(setCachedLargeBufferLimit(5 * page), 4 * page);
  EXPECT_EQ(cachedLargeBufferBytes(), 5 * page);
  EXPECT_EQ(setCachedLargeBufferLimit(0), 5 * page);
  giveLargeBuffer(oldest.data, 3 * page);
  EXPECT_EQ(cachedLargeBufferBytes(), 0u);
  LargeBuffer again = takeLargeBuffer(3 * page);
  EXPECT_TRUE(again.fresh);
  giveLargeBuffer(again.data, 3 * page);
}

} // namespace
} // namespace rnnc

// runtime/data/Tensor.h's memory: large tensors start on a 2 MB boundary, a freed large buffer is
// reused for the next tensor of its size (a training step's tensors are the same every call),
// a reused buffer still reads as the fill asked for, and uninitialized tensors have their shape.
#include "runtime/data/Tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

namespace rnnc {
namespace {

constexpr int64_t kLargeFloats = int64_t{3} << 20; // 12 MB: past the 2 MB threshold

std::uintptr_t address(const Tensor& t) {
  return reinterpret_cast<std::uintptr_t>(t.data());
}

TEST(TensorMemory, LargeTensorsStartOnAHugePageAndSmallOnesOnACacheLine) {
  Tensor large({kLargeFloats});
  EXPECT_EQ(address(large) % (2 << 20), 0u);
  for (int64_t floats : {1, 3, 1000, 100000}) {
    Tensor small({floats});
    EXPECT_EQ(address(small) % 64, 0u) << floats << " floats";
  }
}

TEST(TensorMemory, AFreedLargeBufferIsReusedAndStillFilledAsAsked) {
  std::uintptr_t first = 0;
  {
    Tensor t({kLargeFloats});
    first = address(t);
    std::fill(t.values().begin(), t.values().end(), 7.0f); // leave something behind
  }
  Tensor zeros({2, kLargeFloats / 2}); // the same bytes, another shape
  EXPECT_EQ(address(zeros), first) << "the freed buffer is taken again";
  EXPECT_TRUE(
      std::all_of(zeros.values().begin(), zeros.values().end(), [](float v) { return v == 0.0f; }));
  Tensor ones({kLargeFloats}, 1.0f);
  EXPECT_NE(address(ones), first) << "a buffer in use is not handed out twice";
  EXPECT_TRUE(
      std::all_of(ones.values().begin(), ones.values().end(), [](float v) { return v == 1.0f; }));
}

TEST(TensorMemory, UninitializedTensorsHaveTheirShapeAndAreWritable) {
  for (int64_t floats : {int64_t{5}, kLargeFloats}) {
    Tensor t = Tensor::uninitialized({floats, 2});
    EXPECT_EQ(t.shape(), (TensorShape{floats, 2}));
    EXPECT_EQ(t.numel(), floats * 2);
    std::fill(t.values().begin(), t.values().end(), 3.0f);
    EXPECT_EQ(t.values().back(), 3.0f);
  }
  EXPECT_THROW(Tensor::uninitialized({-1}), std::exception);
}

} // namespace
} // namespace rnnc

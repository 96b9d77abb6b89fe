// runtime/data/Tensor.h's memory: large tensors start on a 2 MB boundary, a freed large buffer is
// reused for the next tensor of its size (a training step's tensors are the same every call),
// a reused buffer still reads as the fill asked for, and uninitialized tensors have their shape;
// a tensor borrowing floats (a mapped file's) holds them where they lie until its last holder
// goes, never frees them, and its copies own their memory.
#include "runtime/data/Tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

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

// Floats owned by a shared_ptr that records when the last holder lets them go.
struct Lender {
  std::vector<float> floats;
  bool released = false;
  std::shared_ptr<const void> owner;
  explicit Lender(std::vector<float> values) : floats(std::move(values)) {
    owner = std::shared_ptr<const void>(floats.data(), [this](const void*) { released = true; });
  }
  BorrowedFloats lend() const { return {owner, const_cast<float*>(floats.data()), floats.size()}; }
};

TEST(TensorMemory, ABorrowingTensorHoldsTheFloatsWhereTheyLieAndItsCopiesOwnTheirs) {
  Lender lender({1, 2, 3, 4, 5, 6});
  {
    Tensor borrowed = Tensor::borrowing({2, 3}, lender.lend());
    lender.owner.reset(); // the tensor is now the only holder
    EXPECT_EQ(borrowed.shape(), (TensorShape{2, 3}));
    EXPECT_EQ(borrowed.data(), lender.floats.data());
    EXPECT_EQ(borrowed.values(), (TensorData{1, 2, 3, 4, 5, 6}));
    borrowed.data()[0] = 10; // written where it lies
    EXPECT_EQ(lender.floats[0], 10);

    Tensor copy = borrowed; // owns its memory
    EXPECT_NE(copy.data(), lender.floats.data());
    EXPECT_EQ(copy.values(), borrowed.values());
    copy.data()[1] = 20;
    EXPECT_EQ(lender.floats[1], 2);

    Tensor moved = std::move(borrowed); // the floats go with the data
    EXPECT_EQ(moved.data(), lender.floats.data());
    Tensor owned({kLargeFloats}, 1.0f);
    std::swap(moved, owned); // each keeps what frees its memory
    EXPECT_EQ(owned.data(), lender.floats.data());
    EXPECT_EQ(moved.numel(), kLargeFloats);
    moved = std::move(owned); // frees the large buffer, lets the floats go with `owned`'s data
    EXPECT_EQ(moved.data(), lender.floats.data());
    EXPECT_FALSE(lender.released) << "a holder is left";
    Tensor reshaped = moved.reshaped({3, 2}); // a copy
    EXPECT_NE(reshaped.data(), lender.floats.data());
  }
  EXPECT_TRUE(lender.released) << "the last holder gone";
  EXPECT_EQ(lender.floats, (std::vector<float>{10, 2, 3, 4, 5, 6})) << "never freed or moved";
}

} // namespace
} // namespace rnnc

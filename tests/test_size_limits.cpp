// Sizes past what 64 bits or memory hold are errors that say so, never a wrapped size, a crash
// or an unnamed std::bad_alloc (issue 18: `rnnc bench --seq 4611686018427387904` was SIGSEGV,
// `param w[4611686018427387905*4, a]` silently [4, a]).
#include "ir/Dim.h"
#include "ir/Error.h"
#include "rnnc/rnnc.h"
#include "runtime/data/Tensor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace rnnc {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHuge = int64_t{1} << 62;

TEST(SizeLimits, TensorElementCountsThatOverflowAreErrors) {
  EXPECT_EQ(numElements({3, 4, 5}), 60);
  EXPECT_EQ(numElements({}), 1);
  try {
    numElements({kHuge, 4, 1});
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("[4611686018427387904, 4, 1]"));
  }
  // Within int64_t but past what bytes can count.
  EXPECT_THROW(numElements({int64_t{1} << 31, int64_t{1} << 31}), UserError);
  EXPECT_THROW(numElements({2, -3}), UserError);
}

TEST(SizeLimits, TensorsMemoryCannotHoldAreErrorsNamingTheirShape) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's allocator reports a huge allocation instead of failing it";
#else
  try {
    Tensor t({100000, 100000, 1000});
    ADD_FAILURE() << "40 TB allocated";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("out of memory for a tensor of shape [100000, 100000, 1000]"));
  }
#endif
}

TEST(SizeLimits, DimArithmeticThatOverflowsIsAnError) {
  using ir::Dim;
  EXPECT_EQ((Dim::symbol("a") * 4 + Dim::constant(3)).str(), "4*a + 3");
  EXPECT_THROW(Dim::constant(kHuge + 1) * 4, UserError);
  EXPECT_THROW(Dim::symbol("a", kHuge) * 2, UserError);
  EXPECT_THROW(Dim::constant(std::numeric_limits<int64_t>::max()) + Dim::constant(1), UserError);
  EXPECT_THROW(Dim::symbol("a", 4).substitute({{"a", kHuge}}), UserError);
}

// Through the public API: a sequence of 2^62 steps is refused before anything is read.
TEST(SizeLimits, TheApiRefusesSequencesPastMemory) {
  std::map<std::string, WeightTensor> weights = {
      {"weight_ih_l0", {{4, 1}, std::vector<float>(4, 0.1f)}},
      {"weight_hh_l0", {{4, 1}, std::vector<float>(4, 0.1f)}},
  };
  Layer layer = Layer::fromWeights(LayerSpec{}, weights);
  std::vector<float> x(8), y(8);
  try {
    layer.forward(x.data(), kHuge, 4, nullptr, nullptr, nullptr, y.data(), nullptr, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("more elements than memory can hold"));
  }
}

} // namespace
} // namespace rnnc

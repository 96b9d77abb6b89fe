// The runtime's weight packer (runtime/exec/WeightPacking.h): its roundings against the
// instructions they stand for (F16C's vcvtps2ph) and hand-worked values, and the packed layout
// against the positions codegen/StoragePlan.h documents, worked out here by hand. The JIT tests
// run the packed weights through real tiles (test_weight_types.cpp, test_int8_products.cpp).
#include "codegen/RunArgs.h"
#include "runtime/exec/WeightPacking.h"

#include <Eigen/Core>

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <immintrin.h>
#include <limits>
#include <random>
#include <vector>

using namespace rnnc;

namespace {

__attribute__((target("f16c"))) uint16_t f16cHalf(float v) {
  return static_cast<uint16_t>(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT));
}

TEST(WeightPacking, HalfRoundingMatchesF16cOnEveryKindOfValue) {
  // Hand-worked: exact, largest, ties to even at both ends of the range, overflow, NaN.
  EXPECT_EQ(halfBits(1.0f), 0x3c00);
  EXPECT_EQ(halfBits(-2.0f), 0xc000);
  EXPECT_EQ(halfBits(65504.0f), 0x7bff);
  EXPECT_EQ(halfBits(65519.0f), 0x7bff);
  EXPECT_EQ(halfBits(65520.0f), 0x7c00); // the tie rounds to even: infinity
  EXPECT_EQ(halfBits(1e9f), 0x7c00);
  EXPECT_EQ(halfBits(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(halfBits(std::ldexp(1.0f, -24)), 0x0001);        // the smallest subnormal
  EXPECT_EQ(halfBits(std::ldexp(1.0f, -25)), 0x0000);        // half of it: a tie, to even (zero)
  EXPECT_EQ(halfBits(std::ldexp(3.0f, -25)), 0x0002);        // 1.5 units: a tie, to even (2)
  EXPECT_EQ(halfBits(std::ldexp(1.0f, -14)), 0x0400);        // the smallest normal
  EXPECT_EQ(halfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00); // a tie below: to even
  EXPECT_EQ(halfBits(1.0f + std::ldexp(3.0f, -11)), 0x3c02); // a tie above: to even
  EXPECT_EQ(halfBits(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);

  if (!__builtin_cpu_supports("f16c"))
    GTEST_SKIP() << "this CPU lacks F16C: only the hand-worked values were checked";
  // Every exponent, with mantissas that hit each rounding case, both signs; and NaN payloads.
  int mismatches = 0;
  for (uint32_t exponent = 0; exponent < 256; ++exponent)
    for (uint32_t mantissa : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7fffffu,
                              0x400000u, 0x7fe000u, 0x7ff000u, 0x5a5a5au, 0x123456u})
      for (uint32_t sign : {0u, 0x80000000u}) {
        const float v = std::bit_cast<float>(sign | exponent << 23 | mantissa);
        if (halfBits(v) != f16cHalf(v) && ++mismatches < 10)
          ADD_FAILURE() << std::hexfloat << v << ": " << std::hex << halfBits(v) << " vs F16C "
                        << f16cHalf(v);
      }
  EXPECT_EQ(mismatches, 0);
}

TEST(WeightPacking, Bf16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(bf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(bf16Bits(std::bit_cast<float>(0x3f808000u)), 0x3f80); // a tie, to even (down)
  EXPECT_EQ(bf16Bits(std::bit_cast<float>(0x3f818000u)), 0x3f82); // a tie, to even (up)
  EXPECT_EQ(bf16Bits(std::bit_cast<float>(0x3f808001u)), 0x3f81); // above the tie
  EXPECT_EQ(bf16Bits(std::bit_cast<float>(0x7f7fffffu)), 0x7f80); // the largest float: inf
  EXPECT_EQ(bf16Bits(std::bit_cast<float>(0x7f800001u)), 0x7fc0); // a signalling NaN, quiet
}

// A layout of `width` columns per block, slice s at column offsets[s] of the weights, its
// packed start starts[s] and its panel panels[s] wide.
std::vector<int64_t> layoutOf(int64_t type, bool transposed, bool pairs, int64_t width,
                              int64_t columns, int64_t depth, int64_t packedDepth,
                              const std::vector<int64_t>& offsets,
                              const std::vector<int64_t>& starts,
                              const std::vector<int64_t>& panels) {
  const auto slices = static_cast<int64_t>(offsets.size());
  std::vector<int64_t> fields(RNNC_PACK_FIELDS);
  fields[RNNC_PACK_WEIGHT_TYPE] = type;
  fields[RNNC_PACK_TRANSPOSED] = transposed;
  fields[RNNC_PACK_DEPTH_PAIRS] = pairs;
  fields[RNNC_PACK_WIDTH] = width;
  fields[RNNC_PACK_BLOCKS] = (columns + width - 1) / width;
  fields[RNNC_PACK_COLUMNS] = columns;
  fields[RNNC_PACK_DEPTH] = depth;
  fields[RNNC_PACK_PACKED_DEPTH] = packedDepth;
  fields[RNNC_PACK_SLICES] = slices;
  for (size_t s = 0; s < offsets.size(); ++s)
    for (int64_t v : {offsets[s], starts[s], panels[s]})
      fields.push_back(v);
  return fields;
}

// A layout of `slices` slices of `width` columns per block, each slice a panel of its own
// (panel width = width), starts one panel after the other.
std::vector<int64_t> layout(int64_t type, bool transposed, int64_t width, int64_t columns,
                            int64_t depth, int64_t packedDepth, std::vector<int64_t> offsets) {
  std::vector<int64_t> starts, panels;
  for (size_t s = 0; s < offsets.size(); ++s) {
    starts.push_back(static_cast<int64_t>(s) * packedDepth * width);
    panels.push_back(width);
  }
  return layoutOf(type, transposed, false, width, columns, depth, packedDepth, offsets, starts,
                  panels);
}

TEST(WeightPacking, Fp32PanelsHoldEachSlicesColumnsPerDepthZeroPastTheColumns) {
  // W^T of a linear: W is [N=6, K=3] (two slices of 3 columns at offsets 0 and 3), w(k, n) =
  // 10 n + k; blocks of 2 columns: 2 blocks, the second's second column past the 3 columns.
  const int64_t depth = 3, width = 2, columns = 3;
  std::vector<float> w(6 * depth);
  for (int64_t n = 0; n < 6; ++n)
    for (int64_t k = 0; k < depth; ++k)
      w[static_cast<size_t>(n * depth + k)] = static_cast<float>(10 * n + k);
  const std::vector<int64_t> fields = layout(0, true, width, columns, depth, depth, {0, 3});
  std::vector<float> packed(2 * 2 * depth * width, -1.0f);
  // Two threads, each its block.
  for (int64_t thread : {0, 1})
    rnnc_pack_weights(fields.data(), w.data(), depth, packed.data(), nullptr, thread, 2);
  // Block b, slice s, depth k, lane l at b*(2*3*2) + s*(3*2) + k*2 + l.
  const std::vector<float> expected = {
      0,  10, 1,  11, 2,  12, // block 0, slice 0: columns 0, 1
      30, 40, 31, 41, 32, 42, // block 0, slice 1: columns 3, 4
      20, 0,  21, 0,  22, 0,  // block 1, slice 0: column 2, then past the columns
      50, 0,  51, 0,  52, 0}; // block 1, slice 1: column 5
  EXPECT_EQ(packed, expected);
}

// Every float layout against a packer written here from the layout's definition, one weight at
// a time: block b, slice s, depth k, lane l at b * packedDepth * slices * width + start(s) +
// k * panelWidth + l (in pairs: word (k / 2) * panelWidth + l, half k % 2), narrowed by the
// scalar roundings (halfBits against F16C above, bf16Bits: Eigen's). Awkward sizes: a depth
// that is no multiple of the packer's 16-depth tiles, columns past the last block's, a slice
// of its own panel and two sharing one, W as a linear's [N, K] and as a matmul's [K, N]; the
// values every rounding case, NaNs of both signs, infinities and subnormals among them. fp32
// widened from fp16 (PackedProduct::widenedFrom) is each weight's half widened by Eigen.
TEST(WeightPacking, EveryFloatLayoutMatchesOneWeightAtATime) {
  std::mt19937 rng(7);
  for (int64_t type : {0, 1, 2})
    for (bool widened : {false, true})
      for (bool pairs : {false, true})
        for (bool transposed : {true, false})
          for (int64_t width : {16, 32, 8}) {
            if ((pairs && type != 2) || (widened && (type != 0 || pairs)))
              continue;
            const int64_t depth = 37, columns = 3 * width - 5, slices = 3;
            const int64_t packedDepth = pairs ? (depth + 1) / 2 : depth;
            const int64_t blocks = (columns + width - 1) / width;
            // Slices 0 and 1 share a panel of twice the width; slice 2 has one of its own.
            const std::vector<int64_t> starts = {0, width, 2 * packedDepth * width};
            const std::vector<int64_t> panels = {2 * width, 2 * width, width};
            std::vector<int64_t> fields =
                layoutOf(type, transposed, pairs, width, columns, depth, packedDepth,
                         {0, columns, 2 * columns}, starts, panels);
            fields[RNNC_PACK_WIDENED_FROM] = widened ? 1 : 0;
            const int64_t allColumns = slices * columns;
            const int64_t rowStride = transposed ? depth + 3 : allColumns + 2;
            std::vector<float> w(
                static_cast<size_t>((transposed ? allColumns : depth) * rowStride));
            std::uniform_int_distribution<uint32_t> bits;
            const std::vector<uint32_t> special = {
                0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7f800000u, 0xff800000u, 0x00000001u,
                0x80400000u, 0x3f808000u, 0x3f818000u, 0x477ff000u, 0x38800000u, 0x33000000u};
            for (size_t i = 0; i < w.size(); ++i)
              w[i] =
                  std::bit_cast<float>(i % 5 == 0 ? special[(i / 5) % special.size()] : bits(rng));
            auto weight = [&](int64_t k, int64_t column) {
              return transposed ? w[static_cast<size_t>(column * rowStride + k)]
                                : w[static_cast<size_t>(k * rowStride + column)];
            };
            const int64_t elements = blocks * packedDepth * slices * width * (pairs ? 2 : 1);
            std::vector<uint32_t> expected(static_cast<size_t>(elements), 0);
            for (int64_t b = 0; b < blocks; ++b)
              for (int64_t s = 0; s < slices; ++s)
                for (int64_t l = 0; l < width; ++l)
                  for (int64_t k = 0; k < (pairs ? 2 * packedDepth : depth); ++k) {
                    const int64_t local = b * width + l;
                    const float v =
                        local < columns && k < depth ? weight(k, s * columns + local) : 0.0f;
                    const float widenedHalf =
                        static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(halfBits(v)));
                    const uint32_t narrowed =
                        type == 0   ? std::bit_cast<uint32_t>(widened ? widenedHalf : v)
                        : type == 1 ? halfBits(v)
                                    : bf16Bits(v);
                    const int64_t panel = panels[static_cast<size_t>(s)];
                    const int64_t base = b * packedDepth * slices * width * (pairs ? 2 : 1);
                    const int64_t at =
                        pairs ? base + 2 * (starts[static_cast<size_t>(s)] + (k / 2) * panel + l) +
                                    k % 2
                              : base + starts[static_cast<size_t>(s)] + k * panel + l;
                    expected[static_cast<size_t>(at)] = narrowed;
                  }
            std::vector<uint32_t> packed(static_cast<size_t>(elements), 0xdeadbeefu);
            std::vector<uint16_t> halves(static_cast<size_t>(elements), 0xbeefu);
            for (int64_t thread : {0, 1}) // two threads, each its blocks
              rnnc_pack_weights(fields.data(), w.data(), rowStride,
                                type == 0 ? static_cast<void*>(packed.data()) : halves.data(),
                                nullptr, thread, 2);
            if (type != 0)
              for (size_t i = 0; i < halves.size(); ++i)
                packed[i] = halves[i];
            for (size_t i = 0; i < packed.size(); ++i)
              ASSERT_EQ(packed[i], expected[i])
                  << "type " << type << (widened ? " widened from fp16" : "")
                  << (pairs ? " pairs" : "") << (transposed ? " W^T" : " W") << " width " << width
                  << ": element " << i;
          }
}

// int8 layouts against the quantization written out here column by column: scale = largest
// magnitude / 127 (1 for a zero column; NaN, with zero levels, where the column holds a NaN or
// an infinity), levels rounded to nearest even, 4 depths a word (byte k % 4 of word
// (k / 4) * panelWidth + l), per block and slice the scales then the levels' column sums.
TEST(WeightPacking, EveryInt8LayoutMatchesAColumnAtATime) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> values(-3.0f, 3.0f);
  for (bool transposed : {true, false})
    for (int64_t width : {16, 32, 8}) {
      const int64_t depth = 37, packedDepth = (depth + 3) / 4, columns = 3 * width - 5;
      const int64_t slices = 2, blocks = (columns + width - 1) / width;
      const std::vector<int64_t> starts = {0, width}, panels = {2 * width, 2 * width};
      const std::vector<int64_t> fields = layoutOf(3, transposed, false, width, columns, depth,
                                                   packedDepth, {0, columns}, starts, panels);
      const int64_t allColumns = slices * columns;
      const int64_t rowStride = transposed ? depth + 3 : allColumns + 2;
      std::vector<float> w(static_cast<size_t>((transposed ? allColumns : depth) * rowStride));
      for (float& v : w)
        v = values(rng);
      auto weight = [&](int64_t k, int64_t column) -> float& {
        return transposed ? w[static_cast<size_t>(column * rowStride + k)]
                          : w[static_cast<size_t>(k * rowStride + column)];
      };
      for (int64_t k = 0; k < depth; ++k) {
        weight(k, 1) = 0.0f;                             // a zero column
        weight(k, 2) = static_cast<float>(k % 7) - 3.0f; // a few levels, the largest negative
        // Scale 1 (largest 127), the others halfway between levels: ties, rounded to even.
        weight(k, 3) = k == 0 ? 127.0f : static_cast<float>(k) - 18.5f;
      }
      weight(5, 4) = std::numeric_limits<float>::quiet_NaN();
      weight(30, columns + 3) = -std::numeric_limits<float>::infinity();

      const int64_t bytes = 4 * blocks * packedDepth * slices * width;
      std::vector<int8_t> expectedLevels(static_cast<size_t>(bytes), 0);
      std::vector<float> expectedScales(static_cast<size_t>(blocks * slices * width * 2), 0.0f);
      for (int64_t b = 0; b < blocks; ++b)
        for (int64_t s = 0; s < slices; ++s)
          for (int64_t l = 0; l < width; ++l) {
            const int64_t local = b * width + l;
            float largest = 0;
            bool bad = false;
            for (int64_t k = 0; local < columns && k < depth; ++k) {
              const float v = weight(k, s * columns + local);
              bad = bad || !std::isfinite(v);
              largest = std::max(largest, std::fabs(v));
            }
            const float scale = largest == 0 ? 1.0f : largest / 127.0f;
            int32_t sum = 0;
            for (int64_t k = 0; local < columns && !bad && k < depth; ++k) {
              const float level = std::nearbyint(weight(k, s * columns + local) / scale);
              const auto q = static_cast<int32_t>(std::clamp(level, -127.0f, 127.0f));
              sum += q;
              expectedLevels[static_cast<size_t>(
                  4 * b * packedDepth * slices * width +
                  4 * (starts[static_cast<size_t>(s)] + (k / 4) * 2 * width + l) + k % 4)] =
                  static_cast<int8_t>(q);
            }
            float* blockScales = expectedScales.data() + b * slices * width * 2;
            blockScales[s * 2 * width + l] = bad ? std::numeric_limits<float>::quiet_NaN() : scale;
            blockScales[s * 2 * width + width + l] = static_cast<float>(sum);
          }
      std::vector<int8_t> levels(static_cast<size_t>(bytes), 99);
      std::vector<float> scales(expectedScales.size(), -1.0f);
      for (int64_t thread : {0, 1})
        rnnc_pack_weights(fields.data(), w.data(), rowStride, levels.data(), scales.data(), thread,
                          2);
      ASSERT_EQ(levels, expectedLevels) << (transposed ? "W^T" : "W") << " width " << width;
      for (size_t i = 0; i < scales.size(); ++i)
        if (std::isnan(expectedScales[i]))
          EXPECT_TRUE(std::isnan(scales[i])) << i;
        else
          EXPECT_EQ(scales[i], expectedScales[i])
              << (transposed ? "W^T" : "W") << " width " << width << ": scale or sum " << i;
    }
}

TEST(WeightPacking, Int8ColumnsAreQuantizedByTheirLargestMagnitude) {
  // A matmul's W [K=5, N=2] (not transposed): column 0 = {127, -63.5, 0.25, 1, 2},
  // column 1 holds a NaN. Depth groups of 4: packed depth 2 (three bytes of padding).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> w = {127, 1, -63.5f, nan, 0.25f, 3, 1, 4, 2, 5};
  const std::vector<int64_t> fields = layout(3, false, 2, 2, 5, 2, {0});
  std::vector<int8_t> packed(4 * 2 * 2, 99);
  std::vector<float> scales(4, -1.0f);
  rnnc_pack_weights(fields.data(), w.data(), 2, packed.data(), scales.data(), 0, 1);
  // Column 0: scale 1, q = round(w) to even: 127, -64, 0, 1, 2; column 1: zeros, NaN scale.
  const std::vector<int8_t> expected = {127, -64, 0, 1, 0, 0, 0, 0,  // group 0: col 0, col 1
                                        2,   0,   0, 0, 0, 0, 0, 0}; // group 1
  EXPECT_EQ(packed, expected);
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_TRUE(std::isnan(scales[1]));
  EXPECT_EQ(scales[2], 127 - 64 + 0 + 1 + 2); // column sums of q
  EXPECT_EQ(scales[3], 0.0f);
}

} // namespace

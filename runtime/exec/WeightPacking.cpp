#include "runtime/exec/WeightPacking.h"

#include "codegen/RunArgs.h"
#include "codegen/WeightType.h"

#include <Eigen/Core>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cpuid.h>
#include <immintrin.h>
#include <limits>

namespace rnnc {

uint16_t halfBits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) // infinity, or a NaN made quiet
    return sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u | ((magnitude >> 13) & 0x3ffu) : 0u);
  if (magnitude >= 0x47800000u) // 2^16 and above: past the largest half, 65504
    return sign | 0x7c00u;
  if (magnitude < 0x38800000u) { // below 2^-14: a subnormal half (or zero)
    // Adding 0.5 leaves the value in units of 2^-24 in the low mantissa bits, rounded to
    // nearest even by the addition itself.
    const float shifted = std::bit_cast<float>(magnitude) + 0.5f;
    return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(shifted) - 0x3f000000u);
  }
  // A normal half: the exponent rebiased (127 -> 15), the 13 dropped bits rounded to nearest
  // even (a carry into the exponent is right, up to infinity).
  const uint32_t lowestKept = (magnitude >> 13) & 1u;
  const uint32_t rounded = magnitude - 0x38000000u + 0xfffu + lowestKept;
  return sign | static_cast<uint16_t>(rounded >> 13);
}

uint16_t bf16Bits(float value) {
  return Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(value)); // as the interpreter rounds
}

namespace {

struct Layout {
  codegen::WeightType type, widenedFrom;
  bool transposed, pairs;
  int64_t width, blocks, columns, depth, packedDepth, slices;
  const int64_t* sliceFields; // per slice: column offset, packed start, panel width

  explicit Layout(const int64_t* f)
      : type(static_cast<codegen::WeightType>(f[RNNC_PACK_WEIGHT_TYPE])),
        widenedFrom(static_cast<codegen::WeightType>(f[RNNC_PACK_WIDENED_FROM])),
        transposed(f[RNNC_PACK_TRANSPOSED] != 0), pairs(f[RNNC_PACK_DEPTH_PAIRS] != 0),
        width(f[RNNC_PACK_WIDTH]), blocks(f[RNNC_PACK_BLOCKS]), columns(f[RNNC_PACK_COLUMNS]),
        depth(f[RNNC_PACK_DEPTH]), packedDepth(f[RNNC_PACK_PACKED_DEPTH]),
        slices(f[RNNC_PACK_SLICES]), sliceFields(f + RNNC_PACK_FIELDS) {}
  int64_t offset(int64_t s) const { return sliceFields[3 * s]; }
  int64_t start(int64_t s) const { return sliceFields[3 * s + 1]; }
  int64_t panelWidth(int64_t s) const { return sliceFields[3 * s + 2]; }
};

// Weight (k, column), zero past the product's columns.
struct Weights {
  const float* w;
  int64_t rowStride;
  bool transposed;
  float at(int64_t k, int64_t column) const {
    return transposed ? w[column * rowStride + k] : w[k * rowStride + column];
  }
};

// The packers go through the weights in tiles of kGroup columns by kGroup depths.
constexpr int64_t kGroup = 16;

// Depths [k0, k0 + kGroup) of columns [at, at + count) into byDepth[depth][column], zero past
// the weights' depth and the `count` columns. Where W is a linear's [N, K] (each column's depths
// contiguous), a line of each column at a time, transposed in registers and L1.
void readTile(const Layout& p, const Weights& w, int64_t k0, int64_t at, int64_t count,
              float (&byDepth)[kGroup][kGroup]) {
  const int64_t depths = std::clamp<int64_t>(p.depth - k0, 0, kGroup);
  if (p.transposed && depths == kGroup && count == kGroup) {
    alignas(64) float byColumn[kGroup][kGroup];
    for (int64_t g = 0; g < kGroup; ++g) {
      const float* row = w.w + (at + g) * w.rowStride + k0;
      for (int64_t d = 0; d < kGroup; ++d)
        byColumn[g][d] = row[d];
    }
    for (int64_t d = 0; d < kGroup; ++d)
      for (int64_t g = 0; g < kGroup; ++g)
        byDepth[d][g] = byColumn[g][d];
    return;
  }
  // W as [K, N] (a backward's products by a weight, dx = dgates * W_ih): a line of each depth,
  // copied as it is. Element by element below, this packing was half of building an LSTM's
  // training program (I=H=512: 3.2 of 7 ms).
  if (!p.transposed && depths == kGroup && count == kGroup) {
    for (int64_t d = 0; d < kGroup; ++d) {
      const float* row = w.w + (k0 + d) * w.rowStride + at;
      for (int64_t g = 0; g < kGroup; ++g)
        byDepth[d][g] = row[g];
    }
    return;
  }
  for (int64_t d = 0; d < kGroup; ++d)
    for (int64_t g = 0; g < kGroup; ++g)
      byDepth[d][g] = d < depths && g < count ? w.at(k0 + d, at + g) : 0.0f;
}

// F16C and the AVX state it needs, asked of CPUID when fp16 weights are first packed. Not
// __builtin_cpu_supports: that links libgcc's CPU model, whose constructor asks a dozen CPUID
// leaves at the start of every process, each an exit to the hypervisor in a VM (7 us on Zen 5).
bool hostHasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d))
    return false;
  const bool f16c = c & (1u << 29), osxsave = c & (1u << 27);
  if (!f16c || !osxsave)
    return false;
  unsigned low = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return (low & 0x6u) == 0x6u; // the OS saves the SSE and AVX registers
}

// halfBits of kGroup floats by vcvtps2ph itself, eight at a time.
__attribute__((target("f16c"))) void halvesByF16c(const float* from, uint16_t* to) {
  for (int64_t i = 0; i < kGroup; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(from + i), _MM_FROUND_TO_NEAREST_INT));
}

// bf16Bits of kGroup floats: Eigen's rounding (to nearest even, a NaN to a quiet one of its sign)
// without its branch, so that the loop is vector code (one value at a time, bf16 packing took
// twice as long as fp32's).
void bf16Group(const float* from, uint16_t* to) {
  for (int64_t g = 0; g < kGroup; ++g) {
    const uint32_t bits = std::bit_cast<uint32_t>(from[g]);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t quietNan = ((bits >> 16) & 0x8000u) | 0x7fc0u;
    to[g] = static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quietNan : rounded);
  }
}

// kGroup floats rounded to fp16 and widened back (PackedProduct::widenedFrom): by vcvtps2ph and
// vcvtph2ps where the CPU has F16C, else halfBits and Eigen's widening, the same values.
__attribute__((target("f16c"))) void widenedHalvesByF16c(const float* from, float* to) {
  for (int64_t i = 0; i < kGroup; i += 8)
    _mm256_storeu_ps(to + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(from + i),
                                                             _MM_FROUND_TO_NEAREST_INT)));
}

void widenedHalves(const float* from, float* to) {
  static const bool f16c = hostHasF16c();
  if (f16c)
    return widenedHalvesByF16c(from, to);
  for (int64_t g = 0; g < kGroup; ++g)
    to[g] = static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(halfBits(from[g])));
}

// fp32, fp16 and bf16 (alone, or in depth pairs: two bf16 halves in a 32-bit element, the
// lower depth in the low half, zero past the depth). In tiles of kGroup columns by kGroup
// depths: the tile read a line of each column at a time (a row of a linear's W), transposed,
// then depth by depth narrowed (fp16 by vcvtps2ph where the CPU has it, as every CPU that runs
// fp16 tiles does: the software rounding gives the same bits at half the speed) and written as
// one contiguous run of the panel. Column by column, each weight a store a panel's width from the
// last, packing took twice as long: a 1024 LSTM's W_ih (4M weights) 5.4-6.9 ms as fp32 against
// 2.4-2.7 now, fp16 4.5-5.3 against 2.6-2.8, bf16 10.1-10.6 against 4.5-4.7
// (`rnnc_bench --benchmark_filter=weightPacking`, Zen 4, alternating runs).
template <class Element>
void packFloats(const Layout& p, const Weights& w, Element* packed, int64_t firstBlock,
                int64_t lastBlock) {
  const int64_t values = p.pairs ? 2 * p.packedDepth : p.depth;
  static const bool f16c = hostHasF16c();
  alignas(64) float byDepth[kGroup][kGroup]; // [depth][column]
  // `group` of a depth's kGroup values to `to`, narrowed. Copies of a size known here, inline
  // vector moves: through one narrowing buffer for every type, or at a run-time size, fp32
  // packing took half as long again (a call per depth).
  auto copyGroup = [](const auto* from, Element* to, int64_t group) {
    if (group == kGroup) {
      for (int64_t g = 0; g < kGroup; ++g)
        to[g] = from[g];
      return;
    }
    std::copy_n(from, group, to);
  };
  auto write = [&](const float* from, Element* to, int64_t group) {
    if constexpr (sizeof(Element) == 4) {
      if (p.widenedFrom == codegen::WeightType::F16) {
        alignas(64) float widened[kGroup];
        widenedHalves(from, widened);
        return copyGroup(widened, to, group);
      }
      copyGroup(from, to, group);
    } else {
      Element narrowed[kGroup];
      if (p.type == codegen::WeightType::F16 && f16c)
        halvesByF16c(from, narrowed);
      else if (p.type == codegen::WeightType::BF16)
        bf16Group(from, narrowed);
      else
        for (int64_t g = 0; g < kGroup; ++g)
          narrowed[g] = halfBits(from[g]);
      copyGroup(narrowed, to, group);
    }
  };
  for (int64_t blk = firstBlock; blk < lastBlock; ++blk) {
    // In elements of the packed type (16-bit halves of a pair's 32-bit words).
    Element* block = packed + blk * p.packedDepth * p.slices * p.width * (p.pairs ? 2 : 1);
    for (int64_t s = 0; s < p.slices; ++s) {
      const int64_t panelWidth = p.panelWidth(s);
      for (int64_t l0 = 0; l0 < p.width; l0 += kGroup) {
        const int64_t group = std::min(kGroup, p.width - l0); // columns of the panel
        const int64_t local = blk * p.width + l0;
        const int64_t inside = std::clamp<int64_t>(p.columns - local, 0, group);
        const int64_t at = local + p.offset(s);
        // The next group's rows of a linear's W (the same slice's next kGroup columns), a line
        // each at this tile's depths: read whole before this group is done, they arrive
        // ahead of their own tiles.
        const bool prefetchNext = p.transposed && local + group + kGroup <= p.columns;
        for (int64_t k0 = 0; k0 < values; k0 += kGroup) {
          if (prefetchNext && k0 < p.depth)
            for (int64_t g = 0; g < kGroup; ++g)
              __builtin_prefetch(w.w + (at + group + g) * w.rowStride + k0);
          readTile(p, w, k0, at, inside, byDepth);
          const int64_t depths = std::min(kGroup, values - k0);
          if (p.pairs) { // word (k / 2) * panelWidth + l of the slice, half k % 2
            for (int64_t d = 0; d < depths; ++d) {
              Element narrowed[kGroup];
              write(byDepth[d], narrowed, kGroup);
              const int64_t k = k0 + d;
              Element* word = block + 2 * (p.start(s) + l0) + 2 * (k / 2) * panelWidth + k % 2;
              for (int64_t g = 0; g < group; ++g)
                word[2 * g] = narrowed[g];
            }
            continue;
          }
          Element* to = block + p.start(s) + l0 + k0 * panelWidth;
          for (int64_t d = 0; d < depths; ++d)
            write(byDepth[d], to + d * panelWidth, group);
        }
      }
    }
  }
}

// int8: each column quantized symmetrically by its largest magnitude (a NaN or infinity makes
// its scale NaN and its weights zero), 4 consecutive depths in a 32-bit word; per block, each
// slice's `width` scales, then its `width` column sums of the quantized weights. A group of
// kGroup columns at a time: their largest magnitudes, then tile by tile (as packFloats) their
// levels, a group's 4 depths of kGroup columns one contiguous run. Column by column, a 1024
// LSTM's W_ih (4M weights) took 12.5 ms.
void packInt8(const Layout& p, const Weights& w, int8_t* packed, float* scales, int64_t firstBlock,
              int64_t lastBlock) {
  const int64_t values = 4 * p.packedDepth;
  alignas(64) float byDepth[kGroup][kGroup]; // [depth][column]
  for (int64_t blk = firstBlock; blk < lastBlock; ++blk) {
    int8_t* block = packed + 4 * blk * p.packedDepth * p.slices * p.width;
    float* blockScales = scales + blk * p.slices * p.width * 2;
    for (int64_t s = 0; s < p.slices; ++s) {
      int8_t* slice = block + 4 * p.start(s);
      const int64_t panelWidth = p.panelWidth(s);
      for (int64_t l0 = 0; l0 < p.width; l0 += kGroup) {
        const int64_t group = std::min(kGroup, p.width - l0); // columns of the panel
        const int64_t local = blk * p.width + l0;
        const int64_t inside = std::clamp<int64_t>(p.columns - local, 0, group);
        const int64_t at = local + p.offset(s);
        float largest[kGroup] = {}, scale[kGroup];
        bool finite[kGroup];
        for (int64_t k0 = 0; k0 < p.depth; k0 += kGroup) {
          readTile(p, w, k0, at, inside, byDepth);
          for (int64_t d = 0; d < kGroup; ++d)
            for (int64_t g = 0; g < kGroup; ++g) {
              const float magnitude = std::fabs(byDepth[d][g]);
              largest[g] = std::isnan(largest[g]) || std::isnan(magnitude)
                               ? std::numeric_limits<float>::quiet_NaN()
                               : std::max(largest[g], magnitude);
            }
        }
        for (int64_t g = 0; g < kGroup; ++g) {
          finite[g] = largest[g] < std::numeric_limits<float>::infinity();
          scale[g] = largest[g] / kInt8WeightLevels;
          if (scale[g] == 0)
            scale[g] = 1;
        }
        int32_t sum[kGroup] = {};
        for (int64_t k0 = 0; k0 < values; k0 += kGroup) {
          readTile(p, w, k0, at, inside, byDepth);
          for (int64_t d = 0; d < std::min(kGroup, values - k0); ++d) {
            const int64_t k = k0 + d;
            // Byte k % 4 of depth group k / 4's word of each column.
            int8_t* to = slice + 4 * ((k / 4) * panelWidth + l0) + k % 4;
            for (int64_t g = 0; g < group; ++g) {
              int32_t q = 0;
              if (finite[g] && k < p.depth) {
                const float level = std::nearbyint(byDepth[d][g] / scale[g]);
                q = static_cast<int32_t>(std::clamp(level, -kInt8WeightLevels, kInt8WeightLevels));
              }
              sum[g] += q;
              to[4 * g] = static_cast<int8_t>(q);
            }
          }
        }
        for (int64_t g = 0; g < group; ++g) {
          const int64_t l = l0 + g;
          blockScales[s * 2 * p.width + l] =
              finite[g] ? scale[g] : std::numeric_limits<float>::quiet_NaN();
          blockScales[s * 2 * p.width + p.width + l] = static_cast<float>(sum[g]);
        }
      }
    }
  }
}

} // namespace

} // namespace rnnc

extern "C" void rnnc_pack_weights(const int64_t* layout, const float* w, int64_t rowStride,
                                  void* packed, float* scales, int64_t thread, int64_t threads) {
  using namespace rnnc;
  const Layout p(layout);
  const Weights weights{w, rowStride, p.transposed};
  // This thread's blocks: the even split the generated code's other work uses.
  const int64_t first = p.blocks * thread / threads, last = p.blocks * (thread + 1) / threads;
  switch (p.type) {
  case codegen::WeightType::F32:
    return packFloats(p, weights, static_cast<float*>(packed), first, last);
  case codegen::WeightType::F16:
  case codegen::WeightType::BF16:
    return packFloats(p, weights, static_cast<uint16_t*>(packed), first, last);
  case codegen::WeightType::I8:
    return packInt8(p, weights, static_cast<int8_t*>(packed), scales, first, last);
  }
}

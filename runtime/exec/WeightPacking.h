// The parameter phase's packing of weights for generated tiles (codegen/RunArgs.h,
// rnnc_pack_weights; the layout is codegen/StoragePlan.h's PackedProduct), and the roundings it
// narrows fp32 weights with: the same as the instructions the tiles' other conversions use
// (vcvtps2ph, and bf16's round to nearest even), so that a weight packed here equals one
// converted in registers. Given to the JIT as an absolute symbol.
#pragma once

#include <cstdint>

extern "C" void rnnc_pack_weights(const int64_t* layout, const float* w, int64_t rowStride,
                                  void* packed, float* scales, int64_t thread, int64_t threads);

namespace rnnc {

// fp32 to IEEE half, rounded to nearest even; overflow to infinity, a NaN stays a quiet NaN
// with its payload's upper bits (vcvtps2ph with rounding mode 0).
uint16_t halfBits(float value);
// fp32 to bf16, rounded to nearest even (Eigen::bfloat16, as the interpreter rounds); a NaN
// stays a quiet NaN.
uint16_t bf16Bits(float value);
// int8 weights: the levels either side of zero (symmetric, per column).
inline constexpr float kInt8WeightLevels = 127;

} // namespace rnnc

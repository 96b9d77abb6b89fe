// How the packed weights of matrix products are stored (`--weights-dtype`). fp32 as given; fp16
// (IEEE half) and bf16 (bfloat16: fp32's exponent, 8 bits of mantissa) in half the bytes, rounded
// to nearest even when the parameter phase packs them and widened to fp32 in registers by the
// tiles, which accumulate in fp32 as before: the products read half the weight bytes, which is
// what bounds a batch-1 step. Everything else (biases, states, the elementwise math) stays fp32.
// int8 is dynamic quantization, as PyTorch's quantize_dynamic: each weight row (an output
// column) symmetric with its own fp32 scale, quantized when packed; each row of the product's
// input quantized as it is read (per step for the recurrent product), 7-bit unsigned with its
// own scale and zero point; int32 sums, dequantized before the elementwise work.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace rnnc::codegen {

enum class WeightType { F32, F16, BF16, I8 };

std::string_view weightTypeName(WeightType type); // "fp32", "fp16", "bf16", "int8"
// "fp32", "fp16", "bf16" or "int8" (also "float32", "float16", "bfloat16", "qint8"); UserError
// naming the choices otherwise.
WeightType parseWeightType(std::string_view name);
int64_t weightTypeBytes(WeightType type); // of one weight

} // namespace rnnc::codegen

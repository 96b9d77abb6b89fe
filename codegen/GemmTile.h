// The register tile of the runtime's general matrix product (runtime/exec/Gemm.h), generated for
// the target like the cells' own tiles: `rnnc_gemm_tile(depth, a, b, c, ldc)` adds
//   c[i * ldc + j] += sum over k < depth of a[k * rows + i] * b[k * columns + j]
// for the whole rows x columns tile, from operands packed k-major (BLIS's micro-panels: the
// tile's `rows` values of A, then its `columns` of B, per depth). Shapes follow from the
// vector width and registers: AVX2 6 rows x 16 columns (12 accumulators of 16 ymm), AVX-512
// 14 x 32 (28 of 32 zmm), SSE 6 x 8: two vectors of B and one broadcast of A per row of FMAs.
// With bf16 pairs (GemmOperands::Bf16Pairs, on targets that pair bf16 products:
// Target::pairsBf16Products), `rnnc_gemm_pair_tile(pairs, a, b, c, ldc)` takes 32-bit words
// instead, each the bf16 values of two consecutive depths (the lower depth in the lower half),
// `rows` words of A and `columns` of B per pair, and adds their products by vdpbf16ps (16 columns
// by a broadcast pair: 32 products an instruction), summed in fp32.
// Compiled by codegen::generateGemmTile (Compiler.h).
#pragma once

#include "codegen/Target.h"

#include <cstdint>
#include <memory>

namespace llvm {
class LLVMContext;
class Module;
} // namespace llvm

extern "C" {
using RnncGemmTileFunction = void (*)(int64_t depth, const float* a, const float* b, float* c,
                                      int64_t ldc);
}

namespace rnnc::codegen {

inline constexpr const char* kGemmTileFunctionName = "rnnc_gemm_tile";
inline constexpr const char* kGemmPairTileFunctionName = "rnnc_gemm_pair_tile";

enum class GemmOperands { F32, Bf16Pairs };

struct GemmTileShape {
  int64_t rows = 0, columns = 0;
};
GemmTileShape gemmTileShape(const Target& target);

std::unique_ptr<llvm::Module> emitGemmTile(llvm::LLVMContext& context, const Target& target,
                                           GemmOperands operands = GemmOperands::F32);

} // namespace rnnc::codegen

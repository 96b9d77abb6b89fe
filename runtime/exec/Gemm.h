// The runtime's general matrix product, C += A B, on the generated register tile
// (codegen/GemmTile.h) rather than a library's: the training's weight and input gradients
// (runtime/layers/Gradients.cpp) are its largest products (dW += G^T X over all T*B rows). Blocked
// as BLIS does: per panel of B's columns and block of the depth, B packed into the tile's column
// strips (kept in L3, each strip of 32 KB read from L1 and L2 while a block of A's rows passes),
// per block of A's rows A packed into the tile's row strips (kept in L2); the tile runs over each
// pair; tiles that overhang C's edges are computed into a scratch tile and only their part in C
// is added. Block sizes follow from the tile and the caches. The operands are any strided views,
// so transposes cost nothing but their packing.
#pragma once

#include "codegen/GemmTile.h"

#include <cstdint>
#include <string>
#include <vector>

namespace rnnc {

// Element (i, j) at data[i * rowStride + j * columnStride].
struct MatrixView {
  const float* data = nullptr;
  int64_t rows = 0, columns = 0;
  int64_t rowStride = 0, columnStride = 1;

  static MatrixView rowMajor(const float* data, int64_t rows, int64_t columns,
                             int64_t leadingDimension) {
    return {data, rows, columns, leadingDimension, 1};
  }
  MatrixView transposed() const { return {data, columns, rows, columnStride, rowStride}; }
  float at(int64_t i, int64_t j) const { return data[i * rowStride + j * columnStride]; }
};

// The operands' precision: fp32, or bf16 (mixed-precision training's products, as the cells'
// bf16 products: both operands rounded to nearest even, the products summed in fp32; multiplied
// in bf16 pairs by vdpbf16ps where the target pairs bf16 products (Target::pairsBf16Products:
// half the bytes packed, twice the products an instruction), elsewhere by the fp32 tile on the
// rounded values). Sums of A's rows (below) are of its values as given.
enum class GemmPrecision { F32, Bf16 };

// C[M, N] += A[M, K] B[K, N], C row-major with `ldc` floats per row, on up to `threads` threads
// (C's rows split between them; a count already resolved, at least 1: the caller's automatic
// count (0) is its ThreadGovernor's to choose, not this product's). The tile is compiled for
// `targetCpu` (CompileOptions::targetCpu: "" for this machine) once per process and target (the
// disk cache keeps it, as it does cells).
void gemmAccumulate(const MatrixView& a, const MatrixView& b, float* c, int64_t ldc, int threads,
                    const std::string& targetCpu = "",
                    GemmPrecision precision = GemmPrecision::F32);

// One A times several B: C_i += A B_i for every product, each block of A packed once for all of
// them, and, with `rowSums` (A's rows of floats), rowSums[i] += the sum of A's row i, taken from
// the packed blocks. A layer's weight gradients share A = G^T, the gate gradients over all
// steps: dW_ih = G^T X, dW_hh = G^T H and the biases' column sums of G then read G once, not
// four times.
struct GemmProduct {
  MatrixView b;
  float* c = nullptr;
  int64_t ldc = 0;
};
void gemmAccumulate(const MatrixView& a, const std::vector<GemmProduct>& products, int threads,
                    float* rowSums = nullptr, const std::string& targetCpu = "",
                    GemmPrecision precision = GemmPrecision::F32);

// The register tile the products above use for `targetCpu` (as CompileOptions::targetCpu: ""
// for this machine, or a CPU's name), compiled on first use.
codegen::GemmTileShape gemmTileShapeFor(const std::string& targetCpu);

} // namespace rnnc

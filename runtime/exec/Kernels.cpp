#include "runtime/exec/Kernels.h"

#include "runtime/exec/Hash.h"

#include "codegen/RunArgs.h"
#include "codegen/TileRows.h"

#include <Eigen/Core>

#include <cmath>

namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
using ConstView = Eigen::Map<const Matrix, 0, Stride>;
using View = Eigen::Map<Matrix, 0, Stride>;

} // namespace

// The matrix products the generated code does not tile itself (ir::hasPackableWeights is false:
// weights that depend on the batch, or that the step computes), none of them on the path of any
// built-in cell: the generated tiles compute the input projection and the recurrent product.
// Eigen's, compiled for the build machine, single-threaded: the generated code splits rows
// between its own threads. No BLAS: BLIS 0.9 picks its kernels from the CPU id, its reference C
// ones on Zen 5.
extern "C" void rnnc_gemm(int64_t transposeB, int64_t m, int64_t n, int64_t k, const float* a,
                          int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0)
    return;
  ConstView A(a, m, k, Stride(lda));
  View C(c, m, n, Stride(ldc));
  if (transposeB)
    C.noalias() = A * ConstView(b, n, k, Stride(ldb)).transpose();
  else
    C.noalias() = A * ConstView(b, k, n, Stride(ldb));
}

extern "C" void rnnc_layernorm_grad(int64_t rows, int64_t cols, const float* x, int64_t ldx,
                                    const float* g, int64_t ldg, float* dx, int64_t lddx,
                                    float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    Eigen::Map<const Eigen::ArrayXf> in(x + r * ldx, cols), grad(g + r * ldg, cols);
    Eigen::Map<Eigen::ArrayXf> out(dx + r * lddx, cols);
    float mean = in.mean();
    float inverseSpread = 1.0f / std::sqrt((in - mean).square().mean() + eps);
    Eigen::ArrayXf y = (in - mean) * inverseSpread;
    float gMean = grad.mean(), gyMean = (grad * y).mean();
    out = (grad - gMean - y * gyMean) * inverseSpread;
  }
}

extern "C" void rnnc_layernorm(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* y,
                               int64_t ldy, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    Eigen::Map<const Eigen::ArrayXf> in(x + r * ldx, cols);
    Eigen::Map<Eigen::ArrayXf> out(y + r * ldy, cols);
    float mean = in.mean();
    float variance = (in - mean).square().mean(); // biased, as torch.nn.LayerNorm
    out = (in - mean) / std::sqrt(variance + eps);
  }
}

extern "C" void rnnc_dropout_mask(int64_t rows, int64_t cols, float* out, int64_t ldo,
                                  int64_t firstRow, int64_t steps, int64_t batch, int64_t reverse,
                                  int64_t maskRow, uint64_t seed, int64_t stream, double p) {
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t s = firstRow + i, position = s / batch;
    const int64_t step = reverse ? steps - 1 - position : position;
    rnnc::fillDropoutMaskRow(seed, static_cast<uint64_t>(stream),
                             static_cast<uint64_t>(maskRow + step * batch + s % batch), p,
                             out + i * ldo, cols);
  }
}

// TileRows.h's policy, which the tests check (test_tile_rows.cpp).
extern "C" int64_t rnnc_tile_split(int64_t rows, int64_t shapes, int64_t field) {
  using namespace rnnc::codegen;
  const TileShapes tileShapes = TileShapes::fromCode(shapes);
  const TileSplit split = splitIntoTiles(rows, tileShapes);
  switch (field) {
  case RNNC_TILES_FULL_END:
    return split.fullEnd;
  case RNNC_TILES_SHORTENED_END:
    return split.shortenedEnd;
  case RNNC_TILES_SHORTER_END:
    return split.shorterEnd;
  case RNNC_TILES_UNITS:
  default:
    return tileUnits(rows, split, tileShapes);
  }
}

extern "C" int64_t rnnc_tile_unit_start(int64_t rows, int64_t shapes, int64_t unit) {
  using namespace rnnc::codegen;
  const TileShapes tileShapes = TileShapes::fromCode(shapes);
  return tileUnitStart(rows, splitIntoTiles(rows, tileShapes), tileShapes, unit);
}

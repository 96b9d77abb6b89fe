#include "runtime/Kernels.h"

#include <Eigen/Core>

#ifdef RNNC_HAVE_BLIS
#include <blis.h>
#endif

#include <cmath>

namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
using ConstView = Eigen::Map<const Matrix, 0, Stride>;
using View = Eigen::Map<Matrix, 0, Stride>;

} // namespace

// The matrix products the generated code does not tile itself: the premultiplied input
// projection over all T*B rows above all. BLIS's single-threaded build (Debian's
// libblis-serial-dev; thread-safe, and it takes any row and column strides) reaches about 88% of
// the FMA peak on it here, Eigen about 67%. The generated code splits rows between its own
// threads, so the BLAS must not start threads of its own.
extern "C" void rnnc_gemm(int64_t transposeB, int64_t m, int64_t n, int64_t k, const float* a,
                          int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0)
    return;
#ifdef RNNC_HAVE_BLIS
  float one = 1.0f, zero = 0.0f;
  // Row-major A [m, k] (row stride lda, column stride 1); B [k, n] or, transposed, [n, k].
  bli_sgemm(BLIS_NO_TRANSPOSE, transposeB ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, m, n, k, &one,
            const_cast<float*>(a), lda, 1, const_cast<float*>(b), ldb, 1, &zero, c, ldc, 1);
  return;
#endif
  ConstView A(a, m, k, Stride(lda));
  View C(c, m, n, Stride(ldc));
  if (transposeB)
    C.noalias() = A * ConstView(b, n, k, Stride(ldb)).transpose();
  else
    C.noalias() = A * ConstView(b, k, n, Stride(ldb));
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

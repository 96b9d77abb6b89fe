// The helpers generated code calls (codegen/RunArgs.h): a GEMM (Eigen's), a row-wise layer
// norm and its gradient, dropout masks, and the tile split of a product's rows. Given to the JIT as
// absolute symbols.
#pragma once

#include <cstdint>

extern "C" {
void rnnc_gemm(int64_t transposeB, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float* c, int64_t ldc);
void rnnc_layernorm(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* y, int64_t ldy,
                    float eps);
void rnnc_layernorm_grad(int64_t rows, int64_t cols, const float* x, int64_t ldx, const float* g,
                         int64_t ldg, float* dx, int64_t lddx, float eps);
void rnnc_dropout_mask(int64_t rows, int64_t cols, float* out, int64_t ldo, int64_t firstRow,
                       int64_t steps, int64_t batch, int64_t reverse, int64_t maskRow,
                       uint64_t seed, int64_t stream, double p);
int64_t rnnc_tile_split(int64_t rows, int64_t shapes, int64_t field);
int64_t rnnc_tile_unit_start(int64_t rows, int64_t shapes, int64_t unit);
}

// int8 matrix products as the reference interpreter computes them (ExecutionOptions::int8Products):
// the scheme of --weights-dtype int8 (codegen/QuantizedProducts.cpp) written out plainly, one
// element at a time, so that the generated tiles have an oracle that is not themselves.
//   - Weights: each output channel (a row of a linear's W, a column of a matmul's) symmetric,
//     scale = max|w| / 127 (1 for a zero channel), q = round(w / scale) in [-127, 127].
//   - Inputs: each row 7-bit unsigned, scale = (max - min) / 127 over the row with 0 in the
//     range (1 for a zero row), zero point z = round(-min / scale), q = round(x / scale) + z in
//     [0, 127].
//   - Exact integer sums, then (sum - z * sum of the channel's q) * x_scale * w_scale in fp32.
// A row or channel holding a NaN or an infinity gives NaN for every product it takes part in.
// Rounding is to nearest even throughout.
#pragma once

#include <cstdint>

namespace rnnc {

// y [rows, columns] = x [rows, depth] times W: W is [columns, depth] (a linear's, x W^T) when
// `weightsByRow`, else [depth, columns] (a matmul's, x W). Row-major, densely packed.
void int8ReferenceProduct(const float* x, int64_t rows, int64_t depth, const float* w,
                          int64_t columns, bool weightsByRow, float* y);

} // namespace rnnc

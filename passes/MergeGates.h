// Gate merging: matrix products of one operand by different weights become one product by the
// stacked weight, followed by slices. A cell written with four separate gate linears
// (x @ W_ii^T, x @ W_if^T, ...) then runs one GEMM per operand, as the built-in LSTM does:
//   linear(x, W1), linear(x, W2)  ->  s = linear(x, stack(W1, W2)); slice(s, 0), slice(s, N1)
// The stacked weight depends on parameters only, so it is built in the pre block, once per
// sequence rather than once per step. matmul(x, W) merges the same way with W's columns
// concatenated.
#pragma once

#include "ir/Cell.h"

namespace rnnc::passes {

bool mergeGates(ir::Cell& cell);

} // namespace rnnc::passes

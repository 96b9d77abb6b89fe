// Constant folding and algebraic simplification:
//   - elementwise ops whose operands are all constants become one constant;
//   - x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1 and -(-x) become x when that keeps the shape;
//   - a slice of the whole operand is the operand; a concat of one part is the part; a slice that
//     lines up exactly with one part of a concat is that part.
// Multiplication by zero is left alone: 0 * inf and 0 * NaN are NaN, not 0.
#pragma once

#include "ir/Cell.h"

namespace rnnc::passes {

bool simplify(ir::Cell& cell);

} // namespace rnnc::passes

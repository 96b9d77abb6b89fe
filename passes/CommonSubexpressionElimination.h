// Replaces an instruction by an earlier identical one: same op, same operands (in either order
// for commutative ops), same attributes and shape. Constants of equal value become one. The
// duplicate is left for dead-code elimination.
#pragma once

#include "ir/Cell.h"

namespace rnnc::passes {

bool eliminateCommonSubexpressions(ir::Cell& cell);

} // namespace rnnc::passes

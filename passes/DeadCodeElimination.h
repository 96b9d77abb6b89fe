// Removes instructions whose results nothing uses (no operand, state update or output). Runs
// after every pass that leaves values behind, e.g. CSE or premultiply.
#pragma once

#include "ir/Cell.h"

namespace rnnc::passes {

bool eliminateDeadCode(ir::Cell& cell);

} // namespace rnnc::passes

// Checks that a whole Cell is well formed: unique argument names, every operand defined before
// use and inside the cell, the pre block independent of states, every shape equal to what the
// shape rules give, valid attributes, one update per state with the state's shape, and a per-step
// output of shape [B, F]. Runs after parsing and after every pass. Throws UserError with the
// reason and the printed IR.
#pragma once

#include "ir/Cell.h"

namespace rnnc::ir {

void verify(const Cell& cell);

} // namespace rnnc::ir

// Values made of parameters and constants alone (a weight built from parameters, such as
// `0.5 * w + tanh(v)`, or a scaled bias) leave the time loop for the `pre` block: computed once
// instead of every step, and a product's weight known before the loop, so that the code
// generator packs it (and stores it as --weights-dtype says) like a parameter. Unlike
// premultiply, this changes no result and moves nothing that reads an input, so it runs with
// --no-premul too: that switch keeps the input projection in the loop, not the parameters'
// arithmetic. Constants go along only where a hoisted value reads them.
#pragma once

#include "ir/Cell.h"

namespace rnnc::passes {

bool hoistParameters(ir::Cell& cell);

} // namespace rnnc::passes

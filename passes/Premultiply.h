// Premultiply (fastrnns' `premul` and `premul_bias`): every matrix product whose left operand
// does not depend on the recurrent state leaves the time loop for the `pre` block, where it runs
// once as one GEMM over all T*B rows instead of T GEMMs over B rows. Biases added to it go with
// it, and sums of bias vectors (b_ih + b_hh) become one vector, so the loop adds nothing but the
// recurrent product.
//
// Two steps:
//  1. Reassociate add trees so that state-independent terms are summed before state-dependent
//     ones, and parameter-only terms (biases) before input-dependent ones:
//       (x W_ih^T + b_ih) + (h W_hh^T + b_hh)  ->  (x W_ih^T + (b_ih + b_hh)) + h W_hh^T
//     (floating-point reassociation: results change in the last bits, as cuDNN's do).
//  2. Move to `pre` the state-independent matrix products, the additions that only combine them
//     with parameters, and whatever state-independent values those need.
#pragma once

#include "ir/Cell.h"

namespace rnnc::passes {

bool premultiply(ir::Cell& cell);

} // namespace rnnc::passes

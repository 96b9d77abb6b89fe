// Premultiply (fastrnns' `premul` and `premul_bias`, generalised): the matrix products that do
// not depend on the recurrent state leave the time loop for the `pre` block, where they run once
// over all T*B rows: the input projection becomes one GEMM over T*B rows instead of T GEMMs over
// B rows, biases added to it go with it, sums of bias vectors (b_ih + b_hh) become one vector, and
// input-side layer norms (lnlstm) leave the loop too. Other state-independent row-wise ops stay
// in the loop: each row costs the same work either way, and in the loop their results live in
// registers instead of arrays over all steps.
//
// Before hoisting, add trees are reassociated so that state-independent terms are summed before
// state-dependent ones, and parameter-only terms (biases) before input-dependent ones:
//   (x W_ih^T + b_ih) + (h W_hh^T + b_hh)  ->  h W_hh^T + (x W_ih^T + (b_ih + b_hh))
// (floating-point reassociation: results change in the last bits, as cuDNN's do).
#pragma once

#include "ir/Cell.h"

namespace rnnc::passes {

bool premultiply(ir::Cell& cell);

} // namespace rnnc::passes

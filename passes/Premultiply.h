// Premultiply (fastrnns' `premul` and `premul_bias`, generalised): everything that does not
// depend on the recurrent state leaves the time loop for the `pre` block, where it runs once over
// all T*B rows: the input projection becomes one GEMM over T*B rows instead of T GEMMs over B
// rows, biases added to it go with it, sums of bias vectors (b_ih + b_hh) become one vector, and
// input-side layer norms (lnlstm) leave the loop too. Every op is row-wise, so each row costs the
// same work either way; the loop keeps only what the state needs.
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

// Elementwise fusion: groups the elementwise ops and slices of each block into `fused` kernels
// that the code generator turns into one loop each. Values a kernel defines and only the kernel
// uses never reach memory; a slice inside a kernel is an offset into what it reads.
//
// A kernel has one iteration space, the shape of its non-scalar members ([B, hidden_size] for an
// LSTM's gates after sink-slices). Matrix products are scheduled as early as their operands
// allow first, so that the elementwise work between them becomes one contiguous run. A value
// without a batch dimension that something outside its kernel reads is not computed inside a
// [B, ...] kernel (once per row) but on its own, once.
#pragma once

#include "ir/Cell.h"

namespace rnnc::passes {

bool fuseElementwise(ir::Cell& cell);

} // namespace rnnc::passes

// Pushes slices towards the values they read: slice(a + b) becomes slice(a) + slice(b) when the
// sum is only ever sliced, and slice(slice(x)) becomes one slice. After this, the elementwise ops
// of an LSTM's gates work in one [B, hidden_size] space and read the [B, 4*hidden_size] GEMM
// result through offsets, so fusion can make a single kernel that reads each gate element once.
#pragma once

#include "ir/Cell.h"

namespace rnnc::passes {

bool sinkSlices(ir::Cell& cell);

// One step of it: rewrites block[index], a slice, through its source (another slice, or an
// elementwise op of the same block that is only ever sliced), the new instructions just before
// it. False when it cannot; the old slice is left dead.
bool sinkSlice(ir::Cell& cell, ir::Block& block, size_t index);

} // namespace rnnc::passes

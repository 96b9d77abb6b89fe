// Matrix-product fusion: a matrix product joins the elementwise kernel that reads it, as the
// kernel's first member: the recurrent product in the step, and the input projection in the pre
// block (its kernel adds the biases to each tile; no [T*B, 4H] product is written before it). The
// code generator then computes the product a tile at a time (a few batch rows by one vector of
// columns of every gate the kernel reads) and runs the kernel's elementwise work on the tile while
// it is still in registers: the [B, 4H] gates of an LSTM are never written to memory, and the
// weights are packed once so that one tile's weights are contiguous (gate-interleaved).
//
// A product x @ W^T (or x @ W) joins kernel k of its block when
//   - x is per row, [B, K], and W is a matrix known before the loop (a parameter or made by the
//     pre block), which the parameter phase packs;
//   - every use of the product is a slice in kernel k as wide as k's iteration space [B, C]
//     (each gate of a chunk), so a tile of columns of k needs the same columns of each slice;
//   - k has no layer norm (its row statistics need whole rows before any column).
// The product moves down to just before the kernel; nothing between them reads it.
#pragma once

#include "ir/Cell.h"

namespace rnnc::passes {

bool fuseMatMul(ir::Cell& cell);

} // namespace rnnc::passes

// Buffers whose rows a loop reads (or writes) side by side: the generated tiles' copies of x
// (StoragePlan.h, PackedProduct::xStride) and the runtime GEMM's packed strips
// (runtime/exec/Gemm.cpp).
#pragma once

#include <cstdint>

namespace rnnc::codegen {

// Floats from one row of `floats` to the next: whole 64-byte lines, an odd number of them, so
// that consecutive rows start in different sets of L1 (64 sets of 64 bytes on every x86-64 core
// we know). Rows a multiple of 4 KB apart all fall in one set: a 14-row tile's broadcasts of x
// at I = 1024 missed L1 (the input projection ran 20% slower than at I = 1000), and packing the
// GEMM's strips, a piece of each at every depth, evicted lines before they were full.
inline int64_t oddLinesApart(int64_t floats) {
  constexpr int64_t kLineFloats = 16;
  const int64_t lines = (floats + kLineFloats - 1) / kLineFloats;
  return (lines | 1) * kLineFloats;
}

} // namespace rnnc::codegen

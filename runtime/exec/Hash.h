// The counter-based hash behind rnnc's dropout masks: masks are pure functions of a seed and
// coordinates, so they are reproducible whatever order or thread computes them.
#pragma once

#include <cmath>
#include <cstdint>

namespace rnnc {

// SplitMix64's finaliser: a well-mixed 64-bit hash of x.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from a hash.
inline double unitInterval(uint64_t hash) {
  return static_cast<double>(hash >> 11) * 0x1.0p-53;
}

// A training dropout's mask (ir::Op::DropoutMask): element (row, column) of dropout `stream` in a
// run seeded `seed` is kept, as 1 / (1 - p), where the hash of those four lands at or above p,
// and dropped (0) below it. `row` counts the rows a direction of a layer runs, step after step
// in the order it runs them (t * B + b for a whole batch; the packed rows of a variable-length
// one), so that every engine draws the same mask whatever its chunks, stretches and threads.
// The hash of (seed, stream, row) is shared by a row's columns.
inline uint64_t dropoutRowHash(uint64_t seed, uint64_t stream, uint64_t row) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ row);
}
// unitInterval(h) < p, in integers: (h >> 11) * 2^-53 < p exactly when h >> 11 is below
// ceil(p * 2^53) (a whole number k is below x exactly when it is below ceil(x); p * 2^53 is
// exact), so that a row's columns are a loop the compiler vectorises.
inline uint64_t dropoutThreshold(double p) {
  return static_cast<uint64_t>(std::ceil(p * 0x1.0p53));
}
inline float dropoutMaskValue(uint64_t rowHash, uint64_t column, uint64_t threshold,
                              float keptValue) {
  return (splitmix64(rowHash ^ column) >> 11) < threshold ? 0.0f : keptValue;
}
// Mask row `row` of dropout `stream`, its `cols` columns into `out`: what the interpreter and the
// JIT's helper (rnnc_dropout_mask) each write for the rows they map to mask rows.
inline void fillDropoutMaskRow(uint64_t seed, uint64_t stream, uint64_t row, double p, float* out,
                               int64_t cols) {
  const float kept = static_cast<float>(1.0 / (1.0 - p));
  const uint64_t threshold = dropoutThreshold(p), rowHash = dropoutRowHash(seed, stream, row);
  for (int64_t c = 0; c < cols; ++c)
    out[c] = dropoutMaskValue(rowHash, static_cast<uint64_t>(c), threshold, kept);
}

} // namespace rnnc

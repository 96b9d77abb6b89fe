// The counter-based hash behind rnnc's dropout masks: masks are pure functions of a seed and
// coordinates, so they are reproducible whatever order or thread computes them.
#pragma once

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

} // namespace rnnc

// cuDNN's and PyTorch's packed batches: `batchSizes[t]` (non-increasing) sequences are active at
// step t, and the rows of step t follow those of step t - 1. A stretch is a run of steps with
// the same active batch: its rows are contiguous, [steps * active, F], so one call of a padded
// runner covers it.
#pragma once

#include <cstdint>
#include <vector>

namespace rnnc {

struct Stretch {
  int64_t steps;    // how many consecutive steps
  int64_t active;   // sequences active in each of them
  int64_t firstRow; // the packed row the stretch starts at
};

// The stretches in step order, up to the first step with no active sequence.
inline std::vector<Stretch> stretchesOf(const std::vector<int64_t>& batchSizes) {
  std::vector<Stretch> stretches;
  int64_t firstRow = 0;
  for (size_t t0 = 0; t0 < batchSizes.size() && batchSizes[t0] > 0;) {
    size_t t1 = t0;
    while (t1 < batchSizes.size() && batchSizes[t1] == batchSizes[t0])
      ++t1;
    stretches.push_back({static_cast<int64_t>(t1 - t0), batchSizes[t0], firstRow});
    firstRow += static_cast<int64_t>(t1 - t0) * batchSizes[t0];
    t0 = t1;
  }
  return stretches;
}

} // namespace rnnc

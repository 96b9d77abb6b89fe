// PyTorch's rnn_eltwise step (shared/seeds/004) as rnnc runs it: the fused elementwise LSTM
// step as a cell, random inputs for it, the bytes it must move at the speed of light, and the
// STREAM triad on a working set of the same size to compare with. Shared by `rnnc bench
// --eltwise` and build/bench/rnnc_bench, so that both time the same thing.
#pragma once

#include "ir/Cell.h"
#include "runtime/data/Tensor.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace rnnc::tools {

struct EltwiseWorkload {
  std::unique_ptr<ir::Cell> cell; // hidden_size bound
  std::vector<Tensor> inputs;     // x, hx, b_ih, b_hh: [1, B, 4H] each
  std::vector<Tensor> states;     // c: [B, H]
  // As rnn_eltwise.py's memory_workload: the four inputs read once, c read once, and the two
  // [B, H] outputs written once.
  double bytesPerStep = 0;
};

EltwiseWorkload makeEltwiseWorkload(int64_t batch, int64_t hidden, uint32_t seed = 3);

// a = b + s * c over three arrays of about `bytes` in all: the STREAM triad (two reads, one
// write).
class Triad {
public:
  explicit Triad(int64_t bytes);
  double bytes() const { return 3.0 * static_cast<double>(n_) * sizeof(float); }
  void run();

private:
  int64_t n_;
  std::vector<float> a_, b_, c_;
};

} // namespace rnnc::tools

#include "tools/EltwiseWorkload.h"

#include "frontend/CellParser.h"

#include <algorithm>
#include <random>

namespace rnnc::tools {
namespace {

// The step as a cell: the four [B, 4H] operands are per-step inputs, the cell state a state.
const char* kEltwiseCell = R"(cell rnn_eltwise(hidden_size) {
  input x[4*hidden_size], hx[4*hidden_size], b_ih[4*hidden_size], b_hh[4*hidden_size]
  state c[hidden_size]
  i, f, g, o = chunk(x + hx + b_ih + b_hh, 4)
  c2 = sigmoid(f) * c + sigmoid(i) * tanh(g)
  h2 = sigmoid(o) * tanh(c2)
  return c = c2; output h2
})";

} // namespace

EltwiseWorkload makeEltwiseWorkload(int64_t batch, int64_t hidden, uint32_t seed) {
  EltwiseWorkload w;
  w.cell = frontend::parseCell(kEltwiseCell, "<rnn_eltwise>");
  w.cell->bindSizes({{"hidden_size", hidden}});
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto random = [&](TensorShape shape) {
    Tensor t(std::move(shape));
    for (float& v : t.values())
      v = dist(rng);
    return t;
  };
  for (int i = 0; i < 4; ++i)
    w.inputs.push_back(random({1, batch, 4 * hidden}));
  w.states.push_back(random({batch, hidden}));
  w.bytesPerStep = (4.0 * batch * 4 * hidden + 2.0 * batch * hidden + batch * hidden) * 4;
  return w;
}

Triad::Triad(int64_t bytes)
    : n_(std::max<int64_t>(bytes / (3 * static_cast<int64_t>(sizeof(float))), 1)), a_(n_),
      b_(n_, 1.0f), c_(n_, 2.0f) {}

void Triad::run() {
  float* __restrict pa = a_.data();
  const float* __restrict pb = b_.data();
  const float* __restrict pc = c_.data();
  for (int64_t i = 0; i < n_; ++i)
    pa[i] = pb[i] + 3.0f * pc[i];
  asm volatile("" : : "r"(pa) : "memory"); // keep the loop
}

} // namespace rnnc::tools

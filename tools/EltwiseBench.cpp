// `rnnc bench --eltwise`: the fused elementwise LSTM step of PyTorch's rnn_eltwise benchmark
// (shared/seeds/004: gates = input + hx + b_ih + b_hh, chunked into four, the LSTM update),
// fused JIT against the op-by-op interpreter, in GB/s of its speed-of-light traffic: every
// input read once, both outputs written once. Next to it, the bandwidth a STREAM triad reaches
// on a working set of the same size, measured by the same command.
#include "tools/EltwiseBench.h"
#include "frontend/CellParser.h"
#include "runtime/CompiledCell.h"
#include "runtime/Interpreter.h"
#include "tools/Timing.h"

#include <fmt/format.h>

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

// a = b + s * c over three arrays of `bytes` in all, the STREAM triad (two reads, one write).
class Triad {
public:
  explicit Triad(int64_t bytes)
      : n_(std::max<int64_t>(bytes / (3 * sizeof(float)), 1)), a_(n_), b_(n_, 1.0f), c_(n_, 2.0f) {}
  double bytes() const { return 3.0 * n_ * sizeof(float); }
  void run() {
    float* __restrict pa = a_.data();
    const float* __restrict pb = b_.data();
    const float* __restrict pc = c_.data();
    for (int64_t i = 0; i < n_; ++i)
      pa[i] = pb[i] + 3.0f * pc[i];
    asm volatile("" : : "r"(pa) : "memory"); // keep the loop
  }

private:
  int64_t n_;
  std::vector<float> a_, b_, c_;
};

} // namespace

int benchEltwise(int64_t batch, int64_t hidden, int repeat) {
  auto cell = frontend::parseCell(kEltwiseCell, "<rnn_eltwise>");
  cell->bindSizes({{"hidden_size", hidden}});
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto random = [&](TensorShape shape) {
    Tensor t(std::move(shape));
    for (float& v : t.values())
      v = dist(rng);
    return t;
  };
  std::vector<Tensor> inputs;
  for (int i = 0; i < 4; ++i)
    inputs.push_back(random({1, batch, 4 * hidden}));
  std::vector<Tensor> initial = {random({batch, hidden})};

  // Speed-of-light traffic, as rnn_eltwise.py's memory_workload: inputs plus two [B, H] outputs.
  const double bytes = (4.0 * batch * 4 * hidden + 2.0 * batch * hidden + batch * hidden) * 4;
  const int calls = 200; // per timed repeat: one step is a few microseconds
  // Each path steps its own state forward; the values stay bounded (c' = f c + i g).
  Interpreter interpreter(*cell, {});
  std::vector<Tensor> interpreterStates = initial;
  CompileOptions options;
  options.pipeline.premultiply = false; // one step: nothing to hoist out of a loop
  options.cache.disk = false;
  auto compiled = CompiledCell::compile(*cell, options);
  std::vector<Tensor> jitStates = initial;
  Tensor output;
  CompiledCell::Workspace workspace;
  Triad triad(static_cast<int64_t>(bytes));
  // The three run in turn within each repeat (see timeInterleaved).
  std::vector<Timing> timings = timeInterleaved(1, repeat,
                                                {[&] {
                                                   for (int i = 0; i < calls; ++i)
                                                     interpreter.run(inputs, interpreterStates);
                                                 },
                                                 [&] {
                                                   for (int i = 0; i < calls; ++i)
                                                     compiled->run(std::vector<Tensor>{}, inputs,
                                                                   jitStates, output, workspace);
                                                 },
                                                 [&] {
                                                   for (int i = 0; i < calls; ++i)
                                                     triad.run();
                                                 }});
  const Timing& unfused = timings[0];
  const Timing& fused = timings[1];
  const double triadGBps = triad.bytes() / (timings[2].median * 1e-3 / calls) * 1e-9;
  auto gbps = [&](const Timing& t) { return bytes / (t.median * 1e-3 / calls) * 1e-9; };

  fmt::print("rnnc bench --eltwise: rnn_eltwise step, b={} hs={}, speed-of-light traffic {:.2f} "
             "MB per step, median of {} repeats of {} steps\n\n",
             batch, hidden, bytes * 1e-6, repeat, calls);
  fmt::print("{:<28}{:>14}{:>10}{:>14}\n", "path", "us per step", "GB/s", "% of triad");
  auto row = [&](const char* name, const Timing& t) {
    fmt::print("{:<28}{:>14.2f}{:>10.1f}{:>13.0f}%\n", name, t.median * 1e3 / calls, gbps(t),
               100 * gbps(t) / triadGBps);
  };
  row("interpreter (unfused)", unfused);
  row("jit (fused)", fused);
  fmt::print("{:<28}{:>14}{:>10.1f}{:>13.0f}%\n", "STREAM triad, same bytes", "", triadGBps, 100.0);
  fmt::print("\nfused speedup over unfused: {:.2f}x\n", unfused.median / fused.median);
  return 0;
}

} // namespace rnnc::tools

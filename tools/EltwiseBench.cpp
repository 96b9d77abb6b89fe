// `rnnc bench --eltwise`: the fused elementwise LSTM step of PyTorch's rnn_eltwise benchmark
// (shared/seeds/004: gates = input + hx + b_ih + b_hh, chunked into four, the LSTM update),
// fused JIT against the op-by-op interpreter, in GB/s of its speed-of-light traffic: every
// input read once, both outputs written once. Next to it, the bandwidth a STREAM triad reaches
// on a working set of the same size, measured by the same command.
#include "tools/EltwiseBench.h"
#include "runtime/exec/CompiledCell.h"
#include "runtime/exec/Interpreter.h"
#include "tools/EltwiseWorkload.h"
#include "tools/Timing.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace rnnc::tools {

int benchEltwise(int64_t batch, int64_t hidden, int repeat, bool json) {
  EltwiseWorkload w = makeEltwiseWorkload(batch, hidden);
  const std::vector<Tensor>& inputs = w.inputs;
  const double bytes = w.bytesPerStep;
  const int calls = 200; // per timed repeat: one step is a few microseconds
  // Each path steps its own state forward; the values stay bounded (c' = f c + i g).
  Interpreter interpreter(*w.cell, {});
  std::vector<Tensor> interpreterStates = w.states;
  CompileOptions options;
  options.pipeline.premultiply = false; // one step: nothing to hoist out of a loop
  options.cache.disk = false;
  auto compiled = CompiledCell::compile(*w.cell, options);
  std::vector<Tensor> jitStates = w.states;
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
                                                                   jitStates, output, workspace, 1);
                                                 },
                                                 [&] {
                                                   for (int i = 0; i < calls; ++i)
                                                     triad.run();
                                                 }});
  const Timing& unfused = timings[0];
  const Timing& fused = timings[1];
  const double triadGBps = triad.bytes() / (timings[2].median * 1e-3 / calls) * 1e-9;
  auto gbps = [&](const Timing& t) { return bytes / (t.median * 1e-3 / calls) * 1e-9; };

  if (json) {
    auto path = [&](const Timing& t) {
      return nlohmann::json{{"us_per_step", t.median * 1e3 / calls},
                            {"min_us_per_step", t.min * 1e3 / calls},
                            {"max_us_per_step", t.max * 1e3 / calls},
                            {"gb_per_s", gbps(t)},
                            {"fraction_of_triad", gbps(t) / triadGBps}};
    };
    nlohmann::json out = {{"benchmark", "rnn_eltwise"},
                          {"batch", batch},
                          {"hidden", hidden},
                          {"bytes_per_step", bytes},
                          {"repeat", repeat},
                          {"steps_per_repeat", calls},
                          {"triad_gb_per_s", triadGBps},
                          {"fused_speedup", unfused.median / fused.median}};
    out["paths"]["interpreter"] = path(unfused);
    out["paths"]["jit"] = path(fused);
    fmt::print("{}\n", out.dump());
    return 0;
  }
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

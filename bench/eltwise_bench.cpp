// Google Benchmark: PyTorch's rnn_eltwise step (shared/seeds/004, b=64 hs=512), fused by the JIT
// against op by op on the interpreter, next to a STREAM triad on a working set of the same size,
// all in bytes per second of the step's speed-of-light traffic (tools/EltwiseWorkload.h), as
// `rnnc bench --eltwise` reports them.
#include "runtime/exec/CompiledCell.h"
#include "runtime/exec/Interpreter.h"
#include "tools/EltwiseWorkload.h"

#include <benchmark/benchmark.h>

namespace {

using rnnc::tools::EltwiseWorkload;

// args: batch, hidden_size
void eltwiseInterpreter(benchmark::State& state) {
  EltwiseWorkload w = rnnc::tools::makeEltwiseWorkload(state.range(0), state.range(1));
  rnnc::Interpreter interpreter(*w.cell, {});
  for (auto _ : state)
    benchmark::DoNotOptimize(interpreter.run(w.inputs, w.states));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * w.bytesPerStep));
}

void eltwiseJit(benchmark::State& state) {
  EltwiseWorkload w = rnnc::tools::makeEltwiseWorkload(state.range(0), state.range(1));
  rnnc::CompileOptions options;
  options.pipeline.premultiply = false; // one step: nothing to hoist out of a loop
  options.cache.disk = false;
  auto compiled = rnnc::CompiledCell::compile(*w.cell, options);
  auto prepared = compiled->prepare({}, 1);
  rnnc::Tensor output;
  rnnc::CompiledCell::Workspace workspace;
  for (auto _ : state) {
    compiled->run(*prepared, w.inputs, w.states, output, workspace, 1);
    benchmark::DoNotOptimize(output.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * w.bytesPerStep));
}

void eltwiseTriad(benchmark::State& state) {
  EltwiseWorkload w = rnnc::tools::makeEltwiseWorkload(state.range(0), state.range(1));
  rnnc::tools::Triad triad(static_cast<int64_t>(w.bytesPerStep));
  for (auto _ : state)
    triad.run();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * triad.bytes()));
}

BENCHMARK(eltwiseInterpreter)->Args({64, 512})->Unit(benchmark::kMicrosecond);
BENCHMARK(eltwiseJit)->Args({64, 512})->Unit(benchmark::kMicrosecond);
BENCHMARK(eltwiseTriad)->Args({64, 512})->Unit(benchmark::kMicrosecond);

} // namespace

// Google Benchmark: whole sequences of the built-in cells on the reference interpreter and on the
// JIT (without premultiply, and with premultiply and fusion), registered side by side so that one
// run of this binary gives comparable numbers: `build/bench/rnnc_bench --benchmark_repetitions=5
// --benchmark_report_aggregates_only=true` reports medians.
#include "frontend/BuiltinCells.h"
#include "runtime/exec/CellBuild.h"
#include "runtime/exec/CompiledCell.h"
#include "runtime/exec/Interpreter.h"

#include <benchmark/benchmark.h>

#include <malloc.h>
#include <random>

namespace {

struct Workload {
  std::unique_ptr<rnnc::ir::Cell> cell;
  std::vector<rnnc::Tensor> params, inputs, states;
};

// args: T, B, input_size, hidden_size
Workload makeWorkload(const char* cellName, const benchmark::State& state) {
  Workload w;
  const int64_t steps = state.range(0), batch = state.range(1);
  w.cell = rnnc::frontend::loadCell(cellName);
  w.cell->bindSizes({{"input_size", state.range(2)}, {"hidden_size", state.range(3)}});
  rnnc::ir::SizeMap sizes = w.cell->sizes;
  sizes[rnnc::ir::kBatchSymbol] = batch;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
  auto random = [&](rnnc::TensorShape shape) {
    rnnc::Tensor t(std::move(shape));
    for (float& v : t.values())
      v = dist(rng);
    return t;
  };
  auto concrete = [&](const rnnc::ir::Shape& shape) {
    rnnc::TensorShape out;
    for (const auto& d : shape)
      out.push_back(*d.evaluate(sizes));
    return out;
  };
  for (const auto& p : w.cell->params)
    w.params.push_back(random(concrete(p->shape)));
  for (const auto& in : w.cell->inputs) {
    auto step = concrete(in->shape);
    w.inputs.push_back(random({steps, step[0], step[1]}));
  }
  for (const auto& s : w.cell->states)
    w.states.push_back(random(concrete(s->shape)));
  return w;
}

void setCounters(benchmark::State& state) {
  const double flopsPerStep = 2.0 * state.range(1) * (state.range(2) + state.range(3)) * 4.0 *
                              state.range(3); // LSTM-sized: 4 gates of input and hidden products
  state.counters["GFLOP/s"] = benchmark::Counter(flopsPerStep * state.range(0) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void interpreter(benchmark::State& state, const char* cellName) {
  Workload w = makeWorkload(cellName, state);
  rnnc::Interpreter interpreter(*w.cell, w.params);
  for (auto _ : state) {
    std::vector<rnnc::Tensor> current = w.states;
    benchmark::DoNotOptimize(interpreter.run(w.inputs, current));
  }
  setCounters(state);
}

void jit(benchmark::State& state, const char* cellName, bool premultiply) {
  Workload w = makeWorkload(cellName, state);
  rnnc::CompileOptions options;
  options.pipeline.premultiply = premultiply;
  options.cache.disk = false;
  auto compiled = rnnc::CompiledCell::compile(*w.cell, options);
  // The weights packed once, as a layer does when it is built (and `rnnc bench`, and oneDNN's
  // reorder): not part of a sequence's time.
  auto prepared = compiled->prepare(w.params, 1);
  rnnc::Tensor output;
  rnnc::CompiledCell::Workspace workspace;
  for (auto _ : state) {
    std::vector<rnnc::Tensor> current = w.states;
    compiled->run(*prepared, w.inputs, current, output, workspace, 1);
    benchmark::DoNotOptimize(output.data());
  }
  setCounters(state);
}

void compileCold(benchmark::State& state, const char* cellName) {
  Workload w = makeWorkload(cellName, state);
  rnnc::CompileOptions options;
  options.cache.disk = false;
  options.memoryCache = false;
  for (auto _ : state)
    benchmark::DoNotOptimize(rnnc::CompiledCell::compile(*w.cell, options));
}

// rnnc's own passes alone (runtime/exec/CellBuild.h, optimiseCell): what a disk-cache hit still
// spends before it can look up its key, and the first part of every cold compile.
void passPipeline(benchmark::State& state, const char* cellName) {
  Workload w = makeWorkload(cellName, state);
  for (auto _ : state)
    benchmark::DoNotOptimize(rnnc::optimiseCell(*w.cell, {}, nullptr));
}

#define RNNC_SEQUENCE_SIZES Args({100, 64, 512, 512})->Args({100, 1, 256, 256})

BENCHMARK_CAPTURE(interpreter, lstm, "lstm")->RNNC_SEQUENCE_SIZES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(jit, lstm_no_premul, "lstm", false)
    ->RNNC_SEQUENCE_SIZES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(jit, lstm, "lstm", true)->RNNC_SEQUENCE_SIZES->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(interpreter, gru, "gru")
    ->Args({100, 64, 512, 512})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(jit, gru, "gru", true)->Args({100, 64, 512, 512})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(compileCold, lstm, "lstm")->Args({1, 1, 512, 512})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(passPipeline, lstm, "lstm")->Args({1, 1, 256, 256})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(passPipeline, gru, "gru")->Args({1, 1, 256, 256})->Unit(benchmark::kMicrosecond);

} // namespace

int main(int argc, char** argv) {
  // As in the rnnc tool: keep freed tensors in the heap instead of page-faulting them back in.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

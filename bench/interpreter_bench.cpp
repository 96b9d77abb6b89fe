// Google Benchmark: the reference interpreter on the built-in cells. The JIT benchmarks register
// beside these so that one binary run compares them side by side.
#include "frontend/BuiltinCells.h"
#include "runtime/Interpreter.h"

#include <benchmark/benchmark.h>

#include <random>

namespace {

rnnc::Tensor randomTensor(rnnc::TensorShape shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
  rnnc::Tensor t(std::move(shape));
  for (float& v : t.values())
    v = dist(rng);
  return t;
}

// args: T, B, input_size, hidden_size
void interpretCell(benchmark::State& state, const char* cellName) {
  const int64_t steps = state.range(0), batch = state.range(1);
  auto cell = rnnc::frontend::loadCell(cellName);
  cell->bindSizes({{"input_size", state.range(2)}, {"hidden_size", state.range(3)}});
  rnnc::ir::SizeMap sizes = cell->sizes;
  sizes[rnnc::ir::kBatchSymbol] = batch;
  std::mt19937 rng(1);
  auto concrete = [&](const rnnc::ir::Shape& shape) {
    rnnc::TensorShape out;
    for (const auto& d : shape)
      out.push_back(*d.evaluate(sizes));
    return out;
  };
  std::vector<rnnc::Tensor> params, inputs, states;
  for (const auto& p : cell->params)
    params.push_back(randomTensor(concrete(p->shape), rng));
  for (const auto& in : cell->inputs) {
    auto step = concrete(in->shape);
    inputs.push_back(randomTensor({steps, step[0], step[1]}, rng));
  }
  for (const auto& s : cell->states)
    states.push_back(randomTensor(concrete(s->shape), rng));
  rnnc::Interpreter interpreter(*cell, params);
  for (auto _ : state) {
    std::vector<rnnc::Tensor> current = states;
    benchmark::DoNotOptimize(interpreter.run(inputs, current));
  }
}

} // namespace

BENCHMARK_CAPTURE(interpretCell, lstm, "lstm")
    ->Args({100, 64, 512, 512})
    ->Args({100, 1, 256, 256})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(interpretCell, gru, "gru")
    ->Args({100, 64, 512, 512})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();

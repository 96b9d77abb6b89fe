// Google Benchmark: rnnc_pack_weights (runtime/exec/WeightPacking.h) on the layouts the JIT asks
// for at an LSTM of I = H = 1024 on this host (what a layer build spends most of its time on,
// beside faulting in the packed buffer, which this leaves out by packing into the same buffer
// every time):
//   build/bench/rnnc_bench --benchmark_filter=weightPacking
// Arguments: the weight type (0 fp32, 1 fp16, 2 bf16, 3 int8), then which product (0: W_ih, the
// input projection's; 1: W_hh, the step's). The layouts come from the plan the JIT makes
// (codegen::packLayout), so that they follow it. Items are weights.
#include "codegen/Compiler.h"
#include "codegen/StoragePlan.h"
#include "frontend/BuiltinCells.h"
#include "passes/PassManager.h"
#include "runtime/exec/WeightPacking.h"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <sstream>
#include <vector>

namespace {

constexpr int64_t kLstmSize = 1024;

void weightPacking(benchmark::State& state) {
  const auto type = static_cast<rnnc::codegen::WeightType>(state.range(0));
  const bool recurrent = state.range(1) == 1;
  auto cell = rnnc::frontend::loadCell("lstm");
  cell->bindSizes({{"input_size", kLstmSize}, {"hidden_size", kLstmSize}});
  std::ostringstream log;
  rnnc::passes::runPipeline(*cell, {}, log);
  const rnnc::codegen::StoragePlan plan =
      rnnc::codegen::planStorage(*cell, rnnc::codegen::hostTarget(), type);
  // The input projection's product is split by rows between threads; the step's by columns.
  const rnnc::codegen::PackedProduct* packed = nullptr;
  for (const rnnc::codegen::PackedProduct& p : plan.packedProducts)
    if (p.splitRows != recurrent)
      packed = &p;
  if (!packed || packed->product->op != rnnc::ir::Op::Linear) {
    state.SkipWithError("the plan has no such product of a linear");
    return;
  }
  const std::vector<int64_t> layout = rnnc::codegen::packLayout(*packed);
  // W of the linear, [N, K] (every slice's columns are rows of it), K its row stride.
  std::vector<float> w(static_cast<size_t>(4 * kLstmSize * packed->depth));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-0.1f, 0.1f);
  for (float& v : w)
    v = dist(rng);
  // A 32-bit word per packed element at most (bf16 pairs and int8 quads share one).
  std::vector<float> to(static_cast<size_t>(
      packed->blocks * packed->width * packed->slices() * packed->packedDepth() + 64));
  std::vector<float> scales(
      static_cast<size_t>(2 * packed->blocks * packed->width * packed->slices()));
  for (auto _ : state) {
    rnnc_pack_weights(layout.data(), w.data(), packed->depth, to.data(), scales.data(), 0, 1);
    benchmark::DoNotOptimize(to.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * packed->slices() * packed->columns * packed->depth);
}

BENCHMARK(weightPacking)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

} // namespace

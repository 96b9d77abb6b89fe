// Google Benchmark: rnnc_pack_weights (runtime/exec/WeightPacking.h) on the layouts the JIT asks
// for at an LSTM of I = H = 1024 (what a layer build spends most of its time on, beside faulting
// in the packed buffer, which this leaves out by packing into the same buffer every time):
//   build/bench/rnnc_bench --benchmark_filter=weightPacking
// Arguments: the weight type (0 fp32, 1 fp16, 2 bf16, 3 int8), then which product (0: W_ih,
// one slice of 4H columns in 32-wide panels; 1: W_hh, four gate slices of H columns, 16 wide,
// two to a panel). Items are weights.
#include "codegen/RunArgs.h"
#include "runtime/exec/WeightPacking.h"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

constexpr int64_t kLstmHidden = 1024, kLstmGateRows = 4 * kLstmHidden;

// The layouts `rnnc compile lstm --size input_size=1024 --size hidden_size=1024 --emit llvm`
// shows for an AVX-512 host (@pack_layout and @pack_layout.1), fp32; for int8 the depth is
// packed in groups of four.
std::vector<int64_t> lstmLayout(int64_t type, bool recurrent) {
  const int64_t packedDepth = type == 3 ? kLstmHidden / 4 : kLstmHidden;
  if (!recurrent)
    return {type, 1, 0, 32, kLstmGateRows / 32, kLstmGateRows, kLstmHidden, packedDepth,
            1,    0, 0, 32};
  std::vector<int64_t> fields{type,        1,           0,           16, kLstmHidden / 16,
                              kLstmHidden, kLstmHidden, packedDepth, 4};
  for (int64_t gate = 0; gate < 4; ++gate) // offset, packed start, panel width
    for (int64_t v :
         {gate * kLstmHidden, (gate / 2) * packedDepth * 32 + (gate % 2) * 16, int64_t{32}})
      fields.push_back(v);
  return fields;
}

void weightPacking(benchmark::State& state) {
  const int64_t type = state.range(0);
  const std::vector<int64_t> layout = lstmLayout(type, state.range(1) == 1);
  std::vector<float> w(static_cast<size_t>(kLstmGateRows * kLstmHidden));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-0.1f, 0.1f);
  for (float& v : w)
    v = dist(rng);
  std::vector<float> packed(w.size() + 64);
  std::vector<float> scales(static_cast<size_t>(2 * kLstmGateRows));
  for (auto _ : state) {
    rnnc_pack_weights(layout.data(), w.data(), kLstmHidden, packed.data(), scales.data(), 0, 1);
    benchmark::DoNotOptimize(packed.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kLstmGateRows * kLstmHidden);
}

BENCHMARK(weightPacking)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

} // namespace

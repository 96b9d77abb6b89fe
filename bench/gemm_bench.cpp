// Google Benchmark: the runtime's GEMM (runtime/exec/Gemm.h, the generated tile) beside Eigen's on
// the training's products at the fastrnns LSTM (T*B = 6400 rows, 4H = 2048, I = H = 512), in one
// binary so that both see the same machine:
//   build/bench/rnnc_bench --benchmark_filter='gemm' --benchmark_repetitions=5
// Arguments: which product (0: dW += G^T X, 1: dX += G W), then the thread count (then, for
// gemmRnnc, the precision: 0 fp32, 1 bf16, mixed-precision training's; for
// gemmWeightGradients, the tile's target: 0 the host, 1 haswell, AVX2's). GFLOP/s is in
// the "FLOPS" counter. gemmTileInL1 (gemmPairTileInL1: bf16's) times the generated register
// tile alone.
#include "codegen/Compiler.h"
#include "codegen/GemmTile.h"
#include "runtime/exec/Gemm.h"
#include "runtime/exec/ObjectLoader.h"

#include <Eigen/Core>
#include <benchmark/benchmark.h>

#if RNNC_BENCH_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include <string>
#include <thread>
#include <vector>

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr int64_t kRows = 6400, kGates = 2048, kFeatures = 512;

struct Operands {
  RowMajor g = RowMajor::Random(kRows, kGates);     // the gate gradients, one row per T*B row
  RowMajor x = RowMajor::Random(kRows, kFeatures);  // the layer's input
  RowMajor w = RowMajor::Random(kGates, kFeatures); // W_ih
  RowMajor dW = RowMajor::Zero(kGates, kFeatures);
  RowMajor dX = RowMajor::Zero(kRows, kFeatures);
};

Operands& operands() {
  static Operands o;
  return o;
}

void setFlops(benchmark::State& state) {
  state.counters["FLOPS"] = benchmark::Counter(2.0 * kRows * kGates * kFeatures,
                                               benchmark::Counter::kIsIterationInvariantRate);
}

void gemmRnnc(benchmark::State& state) {
  Operands& o = operands();
  const bool weightGradient = state.range(0) == 0;
  const int threads = static_cast<int>(state.range(1));
  const rnnc::GemmPrecision precision =
      state.range(2) == 1 ? rnnc::GemmPrecision::Bf16 : rnnc::GemmPrecision::F32;
  rnnc::MatrixView g = rnnc::MatrixView::rowMajor(o.g.data(), kRows, kGates, kGates);
  for (auto _ : state) {
    if (weightGradient)
      rnnc::gemmAccumulate(g.transposed(),
                           rnnc::MatrixView::rowMajor(o.x.data(), kRows, kFeatures, kFeatures),
                           o.dW.data(), kFeatures, threads, "", precision);
    else
      rnnc::gemmAccumulate(g, rnnc::MatrixView::rowMajor(o.w.data(), kGates, kFeatures, kFeatures),
                           o.dX.data(), kFeatures, threads, "", precision);
  }
  setFlops(state);
}

// Eigen as the gradients used it: each thread one block of C's rows.
void gemmEigen(benchmark::State& state) {
  Operands& o = operands();
  const bool weightGradient = state.range(0) == 0;
  const int threads = static_cast<int>(state.range(1));
  for (auto _ : state) {
    const int64_t rows = weightGradient ? kGates : kRows;
    auto part = [&](int i) {
      const int64_t begin = rows * i / threads, end = rows * (i + 1) / threads;
      if (weightGradient)
        o.dW.middleRows(begin, end - begin).noalias() +=
            o.g.middleCols(begin, end - begin).transpose() * o.x;
      else
        o.dX.middleRows(begin, end - begin).noalias() += o.g.middleRows(begin, end - begin) * o.w;
    };
    std::vector<std::thread> helpers;
    for (int i = 1; i < threads; ++i)
      helpers.emplace_back(part, i);
    part(0);
    for (auto& t : helpers)
      t.join();
  }
  setFlops(state);
}

#if RNNC_BENCH_ONEDNN
// oneDNN's sgemm on the same products, a library tuned per ISA by hand: what a fast GEMM reaches
// on this host, to read gemmRnnc against (one thread: oneDNN's own threads are OpenMP's).
void gemmOneDnn(benchmark::State& state) {
  Operands& o = operands();
  const bool weightGradient = state.range(0) == 0;
  for (auto _ : state) {
    // Row-major C = op(A) op(B) + C: dW[G x F] += G^T[G x R] X[R x F]; dX[R x F] += G W.
    const dnnl_status_t status =
        weightGradient ? dnnl_sgemm('T', 'N', kGates, kFeatures, kRows, 1.0f, o.g.data(), kGates,
                                    o.x.data(), kFeatures, 1.0f, o.dW.data(), kFeatures)
                       : dnnl_sgemm('N', 'N', kRows, kFeatures, kGates, 1.0f, o.g.data(), kGates,
                                    o.w.data(), kFeatures, 1.0f, o.dX.data(), kFeatures);
    if (status != dnnl_success)
      state.SkipWithError("dnnl_sgemm failed");
  }
  setFlops(state);
}
#endif

// The register tile alone on operands that stay in L1 (depth 64: 10 KB; 256: the 46 KB the GEMM
// uses at AVX-512): the ceiling of gemmRnnc, whose gap to it is packing and cache misses.
// gemmPairTileInL1: the bf16 pair tile (vdpbf16ps), where the host pairs bf16 products, the
// ceiling of gemmRnnc's bf16 products.
void timeTileInL1(benchmark::State& state, bool pairs) {
  const rnnc::codegen::Target target = rnnc::codegen::hostTarget();
  if (pairs && !target.pairsBf16Products()) {
    state.SkipWithError("this host has no bf16 pair products");
    return;
  }
  const rnnc::codegen::GemmTileShape shape = rnnc::codegen::gemmTileShape(target);
  rnnc::LoadedFunction loaded = rnnc::loadGeneratedCode(
      rnnc::codegen::generateGemmTile(target, rnnc::codegen::Stage::Object,
                                      pairs ? rnnc::codegen::GemmOperands::Bf16Pairs
                                            : rnnc::codegen::GemmOperands::F32),
      pairs ? rnnc::codegen::kGemmPairTileFunctionName : rnnc::codegen::kGemmTileFunctionName);
  auto tile = reinterpret_cast<RnncGemmTileFunction>(loaded.address);
  const int64_t depth = state.range(0);
  // (pairs: the same floats read as words of two bf16 values, all of them normal numbers)
  std::vector<float> a(depth * shape.rows, 0.001f), b(depth * shape.columns, 0.001f),
      c(shape.rows * shape.columns);
  for (auto _ : state)
    tile(pairs ? depth / 2 : depth, a.data(), b.data(), c.data(), shape.columns);
  state.counters["FLOPS"] = benchmark::Counter(2.0 * depth * shape.rows * shape.columns,
                                               benchmark::Counter::kIsIterationInvariantRate);
}

void gemmTileInL1(benchmark::State& state) {
  timeTileInL1(state, false);
}

void gemmPairTileInL1(benchmark::State& state) {
  timeTileInL1(state, true);
}

// A layer's weight gradients: dW_ih = G^T X, dW_hh = G^T H and the bias's column sums of G,
// as separate products and a column sum (0) or as one product sharing G (1, the runtime's way).
void gemmWeightGradients(benchmark::State& state) {
  Operands& o = operands();
  static RowMajor h = RowMajor::Random(kRows, kFeatures);
  static RowMajor dWh = RowMajor::Zero(kGates, kFeatures);
  static Eigen::RowVectorXf dBias = Eigen::RowVectorXf::Zero(kGates);
  const bool shared = state.range(0) == 1;
  const int threads = static_cast<int>(state.range(1));
  const std::string target = state.range(2) == 1 ? "haswell" : ""; // AVX2's tile, or the host's
  const rnnc::MatrixView g = rnnc::MatrixView::rowMajor(o.g.data(), kRows, kGates, kGates);
  const rnnc::MatrixView x = rnnc::MatrixView::rowMajor(o.x.data(), kRows, kFeatures, kFeatures);
  const rnnc::MatrixView hv = rnnc::MatrixView::rowMajor(h.data(), kRows, kFeatures, kFeatures);
  for (auto _ : state) {
    if (shared) {
      rnnc::gemmAccumulate(g.transposed(),
                           {{x, o.dW.data(), kFeatures}, {hv, dWh.data(), kFeatures}}, threads,
                           dBias.data(), target);
    } else {
      rnnc::gemmAccumulate(g.transposed(), x, o.dW.data(), kFeatures, threads, target);
      rnnc::gemmAccumulate(g.transposed(), hv, dWh.data(), kFeatures, threads, target);
      dBias.noalias() += Eigen::RowVectorXf::Ones(kRows) * o.g;
    }
  }
  state.counters["FLOPS"] = benchmark::Counter(4.0 * kRows * kGates * kFeatures,
                                               benchmark::Counter::kIsIterationInvariantRate);
}

} // namespace

BENCHMARK(gemmRnnc)
    ->ArgsProduct({{0, 1}, {1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
#if RNNC_BENCH_ONEDNN
BENCHMARK(gemmOneDnn)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
#endif
BENCHMARK(gemmEigen)->ArgsProduct({{0, 1}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(gemmWeightGradients)
    ->ArgsProduct({{0, 1}, {1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(gemmTileInL1)->Arg(64)->Arg(256);
BENCHMARK(gemmPairTileInL1)->Arg(64)->Arg(256);

// Google Benchmark: how fast one core reads a block of weights over and over, as the time loop
// reads W_hh at batch 1: all of it every step, odd steps backwards (as the generated code walks
// its column blocks). At batch 1 a step is a matrix-vector product, so this read rate bounds the
// loop whatever the kernel does: the LSTM at I=H=256 reads 1 MB of W_hh a step, against a
// 512 KB L2 per core on our machines. Compare
//   build/bench/rnnc_bench --benchmark_filter='weightStream|jit/lstm/100/1/'
// the loop's time per step against the 1 MB pass here.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <memory>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace {

// Sums n floats (a multiple of 64), 8 independent chains, so the sum is bound by the reads.
float sumForwards(const float* p, int64_t n) {
#ifdef __AVX2__
  __m256 acc[8];
  for (auto& a : acc)
    a = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 64)
    for (int k = 0; k < 8; ++k)
      acc[k] = _mm256_add_ps(acc[k], _mm256_load_ps(p + i + 8 * k));
  for (int k = 1; k < 8; ++k)
    acc[0] = _mm256_add_ps(acc[0], acc[k]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
#else
  float acc[64] = {};
  for (int64_t i = 0; i < n; i += 64)
    for (int k = 0; k < 64; ++k)
      acc[k] += p[i + k];
  float sum = 0;
  for (float a : acc)
    sum += a;
  return sum;
#endif
}

float sumBackwards(const float* p, int64_t n) {
  float sum = 0;
  for (int64_t end = n; end > 0; end -= 4096) { // 16 KB pieces, last first
    int64_t begin = end > 4096 ? end - 4096 : 0;
    sum += sumForwards(p + begin, end - begin);
  }
  return sum;
}

// arg: kilobytes read per pass (one "step")
void weightStream(benchmark::State& state) {
  const int64_t floats = state.range(0) * 1024 / 4;
  std::unique_ptr<float, decltype(&std::free)> weights(
      static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(floats) * 4)), &std::free);
  for (int64_t i = 0; i < floats; ++i)
    weights.get()[i] = 1.0f / static_cast<float>(1 + i % 7);
  int64_t pass = 0;
  for (auto _ : state) {
    float sum =
        (pass++ & 1) ? sumBackwards(weights.get(), floats) : sumForwards(weights.get(), floats);
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(state.iterations() * floats * 4);
}

BENCHMARK(weightStream)
    ->Arg(128)
    ->Arg(256)
    ->Arg(512)
    ->Arg(1024)
    ->Arg(4096)
    ->Unit(benchmark::kMicrosecond);

} // namespace

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

#include <immintrin.h>

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

// The batch-1 step is a matrix-vector product: every weight is read once and multiplied once.
// With fp16 weights each is widened first (vcvtph2ps), and that, not reading them, can bound
// the step: Zen 4 widens one zmm every two cycles (8 weights a cycle), not far above the rate
// it reads fp32 weights from L2, so fp16 weights there are ~1.2x fp32 at batch 1, not the 2x
// their bytes suggest. Items are weights; args: kilobytes of fp32 (the fp16 ones are half).
// Each pass is 8 independent FMA chains over the weights, as the generated tiles' are.

// GCC 12's AVX-512 headers start some intrinsics from an "undefined" vector, which it then
// reports as uninitialized when they are compiled under a target attribute.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,f16c,fma"))) float gemvZmm(const void* w, int64_t n, bool half) {
  __m512 acc[8];
  for (auto& a : acc)
    a = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(0.5f);
  for (int64_t i = 0; i < n; i += 128)
    for (int k = 0; k < 8; ++k) {
      const int64_t at = i + 16 * k;
      __m512 v = half ? _mm512_cvtph_ps(_mm256_load_si256(
                            reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + at)))
                      : _mm512_load_ps(static_cast<const float*>(w) + at);
      acc[k] = _mm512_fmadd_ps(x, v, acc[k]);
    }
  for (int k = 1; k < 8; ++k)
    acc[0] = _mm512_add_ps(acc[0], acc[k]);
  return _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx2,f16c,fma"))) float gemvYmm(const void* w, int64_t n, bool half) {
  __m256 acc[8];
  for (auto& a : acc)
    a = _mm256_setzero_ps();
  const __m256 x = _mm256_set1_ps(0.5f);
  for (int64_t i = 0; i < n; i += 64)
    for (int k = 0; k < 8; ++k) {
      const int64_t at = i + 8 * k;
      __m256 v = half ? _mm256_cvtph_ps(_mm_load_si128(
                            reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + at)))
                      : _mm256_load_ps(static_cast<const float*>(w) + at);
      acc[k] = _mm256_fmadd_ps(x, v, acc[k]);
    }
  for (int k = 1; k < 8; ++k)
    acc[0] = _mm256_add_ps(acc[0], acc[k]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  return lanes[0] + lanes[7];
}

#pragma GCC diagnostic pop

// arg: kilobytes of the weights in fp32; `half`: stored as fp16; `zmm`: 16-float vectors.
void weightGemv(benchmark::State& state, bool half, bool zmm) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("f16c") ||
      !__builtin_cpu_supports("fma") || (zmm && !__builtin_cpu_supports("avx512f"))) {
    state.SkipWithError("this CPU lacks the instructions");
    return;
  }
  const int64_t n = state.range(0) * 1024 / 4; // weights
  const size_t bytes = static_cast<size_t>(n) * (half ? 2 : 4);
  std::unique_ptr<void, decltype(&std::free)> weights(std::aligned_alloc(64, bytes), &std::free);
  for (int64_t i = 0; i < n; ++i) {
    if (half)
      static_cast<uint16_t*>(weights.get())[i] = 0x3c00; // 1.0
    else
      static_cast<float*>(weights.get())[i] = 1.0f;
  }
  for (auto _ : state) {
    float sum = zmm ? gemvZmm(weights.get(), n, half) : gemvYmm(weights.get(), n, half);
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(state.iterations() * n);
}

BENCHMARK_CAPTURE(weightGemv, fp32_zmm, false, true)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(weightGemv, fp16_zmm, true, true)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(weightGemv, fp32_ymm, false, false)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(weightGemv, fp16_ymm, true, false)->Arg(1024)->Unit(benchmark::kMicrosecond);

} // namespace

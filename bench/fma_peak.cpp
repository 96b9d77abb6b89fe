// fma_peak: the single-precision FMA peak of this CPU, measured, for bench/compare's "% of peak".
//
//   fma_peak --threads 2 --ms 100 --runs 5
//   {"engine":"fma_peak","threads":2,"gflops":...,...}
//
// Each thread runs independent FMA chains on the widest vectors the CPU has (AVX-512, else
// AVX2 + FMA, else plain C++), with enough accumulators to cover the FMA latency times the
// number of FMA pipes (Zen 3: 4 cycles x 2 pipes = 8 chains of ymm; 12 are used). A run is
// every thread looping for --ms milliseconds after a common start; gflops is the median over
// --runs runs of all threads' flops over the run's wall time. Each chain is a contraction
// (a = a * m + c, m < 1) that converges to c / (1 - m), which is checked, so the work can be
// neither removed nor overflow into infinities or denormals.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FMA_PEAK_X86 1
#endif

namespace {

using Clock = std::chrono::steady_clock;

constexpr float kMul = 0.9999f, kAdd = 1e-4f; // fixed point kAdd / (1 - kMul) = 1
constexpr long kBlock = 1 << 16;              // iterations between clock reads

struct Result {
  double flops = 0;    // floating-point operations done (2 per FMA lane)
  double checksum = 0; // mean of every accumulator lane; ~1 after enough iterations
};

// Each kernel runs `kBlock`-iteration blocks until `deadline` and returns its flops and the
// mean of its accumulators. `seed` differs per thread and is unknown at compile time, so the
// chains cannot be folded into one.

#ifdef FMA_PEAK_X86
__attribute__((target("avx512f"))) Result kernelAvx512(float seed, Clock::time_point deadline) {
  constexpr int N = 24; // of 32 zmm registers
  __m512 acc[N];
  for (int i = 0; i < N; ++i)
    acc[i] = _mm512_set1_ps(seed + 0.001f * static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(kMul), c = _mm512_set1_ps(kAdd);
  long blocks = 0;
  do {
    for (long it = 0; it < kBlock; ++it)
      for (int i = 0; i < N; ++i)
        acc[i] = _mm512_fmadd_ps(acc[i], m, c);
    ++blocks;
  } while (Clock::now() < deadline);
  float sum = 0;
  alignas(64) float lanes[16];
  for (int i = 0; i < N; ++i) {
    _mm512_store_ps(lanes, acc[i]);
    for (float v : lanes)
      sum += v;
  }
  return {2.0 * 16 * N * kBlock * static_cast<double>(blocks), sum / (16.0 * N)};
}

__attribute__((target("avx2,fma"))) Result kernelAvx2(float seed, Clock::time_point deadline) {
  constexpr int N = 12; // of 16 ymm registers, two kept for the constants
  __m256 acc[N];
  for (int i = 0; i < N; ++i)
    acc[i] = _mm256_set1_ps(seed + 0.001f * static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(kMul), c = _mm256_set1_ps(kAdd);
  long blocks = 0;
  do {
    for (long it = 0; it < kBlock; ++it)
      for (int i = 0; i < N; ++i)
        acc[i] = _mm256_fmadd_ps(acc[i], m, c);
    ++blocks;
  } while (Clock::now() < deadline);
  float sum = 0;
  alignas(32) float lanes[8];
  for (int i = 0; i < N; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    for (float v : lanes)
      sum += v;
  }
  return {2.0 * 8 * N * kBlock * static_cast<double>(blocks), sum / (8.0 * N)};
}
#endif

// No vector FMA: a multiply and an add on plain floats, vectorised as far as the build allows
// (std::fma would be a library call on such a CPU).
Result kernelGeneric(float seed, Clock::time_point deadline) {
  constexpr int N = 64;
  float acc[N];
  for (int i = 0; i < N; ++i)
    acc[i] = seed + 0.001f * static_cast<float>(i);
  long blocks = 0;
  do {
    for (long it = 0; it < kBlock; ++it)
      for (int i = 0; i < N; ++i)
        acc[i] = acc[i] * kMul + kAdd;
    ++blocks;
  } while (Clock::now() < deadline);
  float sum = 0;
  for (float v : acc)
    sum += v;
  return {2.0 * N * kBlock * static_cast<double>(blocks), sum / N};
}

using Kernel = Result (*)(float, Clock::time_point);

Kernel pickKernel(const char** isa) {
#ifdef FMA_PEAK_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    *isa = "avx512f";
    return kernelAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    *isa = "avx2+fma";
    return kernelAvx2;
  }
#endif
  *isa = "generic";
  return kernelGeneric;
}

// One run: `threads` threads start together, loop for `ms`, and the flops of all of them are
// divided by the wall time from the common start to the last one's end.
double runOnce(Kernel kernel, int threads, int ms, float seed, bool* ok) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<Result> results(threads);
  std::vector<std::thread> pool;
  Clock::time_point start;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      results[t] =
          kernel(seed + 0.01f * static_cast<float>(t), start + std::chrono::milliseconds(ms));
    });
  while (ready.load() < threads) {
  }
  start = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool)
    th.join();
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  double flops = 0;
  for (const Result& r : results) {
    flops += r.flops;
    if (!(std::fabs(r.checksum - 1.0) < 1e-2)) // the chains' fixed point is 1
      *ok = false;
  }
  return flops / seconds * 1e-9;
}

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: fma_peak [--threads N] [--ms MS] [--runs R]\n"
               "Measures the fp32 FMA peak with N threads (default 1), each run MS ms long "
               "(default 200), and prints the median of R runs (default 5) as JSON.\n");
  std::exit(code);
}

int parseInt(const char* flag, const char* text, int min) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < min || v > 1000000) {
    std::fprintf(stderr, "fma_peak: %s wants an integer >= %d, got '%s'\n", flag, min, text);
    std::exit(2);
  }
  return static_cast<int>(v);
}

} // namespace

int main(int argc, char** argv) {
  int threads = 1, ms = 200, runs = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help")
      usage(0);
    if (i + 1 >= argc) {
      std::fprintf(stderr, "fma_peak: unknown option or missing value: %s\n", a.c_str());
      usage(2);
    }
    const char* v = argv[++i];
    if (a == "--threads")
      threads = parseInt("--threads", v, 1);
    else if (a == "--ms")
      ms = parseInt("--ms", v, 1);
    else if (a == "--runs")
      runs = parseInt("--runs", v, 1);
    else {
      std::fprintf(stderr, "fma_peak: unknown option %s\n", a.c_str());
      usage(2);
    }
  }

  const char* isa = nullptr;
  Kernel kernel = pickKernel(&isa);
  // Not a constant the compiler could see through: the chains start from the argument count.
  const float seed = 0.5f + 0.001f * static_cast<float>(argc);
  bool ok = true;
  std::vector<double> gflops;
  for (int r = 0; r < runs; ++r)
    gflops.push_back(runOnce(kernel, threads, ms, seed, &ok));
  if (!ok) {
    std::fprintf(stderr, "fma_peak: the FMA chains did not reach their fixed point; the loop "
                         "was miscompiled or cut short\n");
    return 1;
  }
  std::vector<double> sorted = gflops;
  std::sort(sorted.begin(), sorted.end());
  size_t n = sorted.size();
  double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  std::printf("{\"engine\":\"fma_peak\",\"threads\":%d,\"gflops\":%.6g,\"min_gflops\":%.6g,"
              "\"max_gflops\":%.6g,\"per_thread_gflops\":%.6g,\"isa\":\"%s\",\"ms\":%d,"
              "\"runs\":%d,\"hardware_threads\":%u}\n",
              threads, median, sorted.front(), sorted.back(), median / threads, isa, ms, runs,
              std::thread::hardware_concurrency());
  return 0;
}

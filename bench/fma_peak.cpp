// fma_peak: the single-precision FMA peak of this CPU, measured, for bench/compare's "% of peak".
//
//   fma_peak --threads 2 --ms 100 --runs 5
//   {"engine":"fma_peak","threads":2,"gflops":...,"ghz":...,"flop_per_cycle":...,...}
//
// Each thread runs independent FMA chains with enough accumulators to cover the FMA latency
// times the FMA pipes of any core we know (4-5 cycles x 2-4 pipes: 28 chains of zmm, 14 of ymm),
// on every vector width the CPU has, and the better width is the peak: Zen 4 runs zmm as two
// halves, so its ymm and zmm peaks are the same, while Intel's and Zen 5's zmm doubles them.
// The chains are kept in registers by full unrolling (an array of accumulators that the compiler
// leaves in memory turns every FMA into a load and a store: 24 zmm chains read 75 GFLOP/s on a
// Zen 4 core whose peak is 117). A run is every thread looping for --ms milliseconds after a
// common start; gflops is the median over --runs runs of all threads' flops over the run's wall
// time. Each chain is a contraction (a = a * m + c, m < 1) that converges to c / (1 - m), which
// is checked, so the work can be neither removed nor overflow into infinities or denormals.
//
// The clock is measured too, with a chain of dependent integer adds (one cycle each on every
// x86-64 core), so the peak is also given in FLOP per cycle: 32 on a core with two 256-bit FMA
// pipes (Zen 3, Zen 4), 64 with two 512-bit ones (Intel AVX-512, Zen 5). A figure far from
// these says the meter, not the machine, is off.
//
// --bf16 measures vdpbf16ps instead (AVX512_BF16: each fp32 lane adds the products of two bf16
// pairs, 4 FLOP, twice an FMA's), the peak of rnnc's bf16 products on AMD's cores (bench/compare
// --dtype bf16 reads their % of it): 28 zmm chains, each lane adding 2^-24 + 2^-24 a step from
// zero, exactly, until its sums round away past 2 (the check: every lane of every chain holds
// the same positive value, at most 4, so the work ran alike and nothing overflowed). 64 FLOP
// per cycle where zmm runs as two halves (Zen 4), 128 with two full pipes (Zen 5).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
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
// chains cannot be folded into one. A macro rather than a template: the intrinsics inline only
// into a function compiled for their ISA.
#define FMA_PEAK_KERNEL(NAME, ISA, VEC, LANES, CHAINS, FMADD, SET1, STOREU)                        \
  __attribute__((target(ISA))) Result NAME(float seed, Clock::time_point deadline) {               \
    VEC acc[CHAINS];                                                                               \
    _Pragma("GCC unroll 64") for (int i = 0; i < CHAINS; ++i) acc[i] =                             \
        SET1(seed + 0.001f * static_cast<float>(i));                                               \
    const VEC m = SET1(kMul), c = SET1(kAdd);                                                      \
    long blocks = 0;                                                                               \
    do {                                                                                           \
      for (long it = 0; it < kBlock; ++it) {                                                       \
        _Pragma("GCC unroll 64") for (int i = 0; i < CHAINS; ++i) acc[i] = FMADD(acc[i], m, c);    \
      }                                                                                            \
      ++blocks;                                                                                    \
    } while (Clock::now() < deadline);                                                             \
    float sum = 0;                                                                                 \
    float lanes[LANES];                                                                            \
    for (int i = 0; i < CHAINS; ++i) {                                                             \
      STOREU(lanes, acc[i]);                                                                       \
      for (float v : lanes)                                                                        \
        sum += v;                                                                                  \
    }                                                                                              \
    return {2.0 * LANES * CHAINS * kBlock * static_cast<double>(blocks),                           \
            sum / (static_cast<double>(LANES) * CHAINS)};                                          \
  }

#ifdef FMA_PEAK_X86
// 28 of 32 zmm registers: Zen 5 and Intel have 2 zmm FMA pipes of latency 4, 8 chains' worth.
FMA_PEAK_KERNEL(kernelAvx512, "avx512f", __m512, 16, 28, _mm512_fmadd_ps, _mm512_set1_ps,
                _mm512_storeu_ps)
// 14 of 16 ymm registers, two kept for the constants.
FMA_PEAK_KERNEL(kernelAvx2, "avx2,fma", __m256, 8, 14, _mm256_fmadd_ps, _mm256_set1_ps,
                _mm256_storeu_ps)

// vdpbf16ps chains (see --bf16 above); the operands, 2^-12 (exact in bf16), are made from `seed`
// so that the compiler cannot know them.
__attribute__((target("avx512f,avx512bf16"))) Result kernelBf16(float seed,
                                                                Clock::time_point deadline) {
  constexpr int kChains = 28, kLanes = 16;
  __m512 acc[kChains];
  _Pragma("GCC unroll 64") for (int i = 0; i < kChains; ++i) acc[i] = _mm512_setzero_ps();
  const float factor = 0x1.0p-12f * (seed / seed); // each product 2^-24
  const __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_set1_ps(factor), _mm512_set1_ps(factor));
  long blocks = 0;
  do {
    for (long it = 0; it < kBlock; ++it) {
      _Pragma("GCC unroll 64") for (int i = 0; i < kChains; ++i) acc[i] =
          _mm512_dpbf16_ps(acc[i], pair, pair);
    }
    ++blocks;
  } while (Clock::now() < deadline);
  float lanes[kLanes];
  _mm512_storeu_ps(lanes, acc[0]);
  const float first = lanes[0];
  bool alike = first > 0 && first <= 4;
  for (int i = 0; i < kChains; ++i) {
    _mm512_storeu_ps(lanes, acc[i]);
    for (float v : lanes)
      alike = alike && v == first;
  }
  // (the checksum is 1 when every lane holds the same value in (0, 4], else 0: runOnce's check)
  return {4.0 * kLanes * kChains * kBlock * static_cast<double>(blocks), alike ? 1.0 : 0.0};
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

// The clock of the core this runs on, in GHz: a chain of dependent integer adds, one cycle each,
// 64 per loop iteration (the loop's own counter and branch run beside the chain), for `ms`,
// after as long again untimed: a core that was idle takes milliseconds to reach its clock (a
// 12 ms measurement right away read 3.2 GHz on a Zen 4 core that runs at 3.6).
double measureGhz(int ms) {
  const long y = ms; // unknown to the compiler where it matters: inside the asm
  auto chain = [y](Clock::time_point deadline, long* iterations) {
    long x = 1; // a local, so in a register: a captured one went to memory around every asm,
                // and its store-to-load forwarding added cycles to the chain (3.3 GHz read)
    Clock::time_point now;
    do {
      for (int i = 0; i < 4096; ++i) {
#ifdef FMA_PEAK_X86
        asm volatile(".rept 64\n\taddq %1, %0\n\t.endr" : "+r"(x) : "r"(y));
#else
        for (int j = 0; j < 64; ++j)
          asm volatile("" : "+r"(x) : "r"(y));
#endif
      }
      *iterations += 4096;
      now = Clock::now();
    } while (now < deadline);
    return now;
  };
  long iterations = 0;
  chain(Clock::now() + std::chrono::milliseconds(ms), &iterations); // warming up
  iterations = 0;
  const auto start = Clock::now();
  const auto end = chain(start + std::chrono::milliseconds(ms), &iterations);
  double seconds = std::chrono::duration<double>(end - start).count();
  return 64.0 * static_cast<double>(iterations) / seconds * 1e-9;
}

using Kernel = Result (*)(float, Clock::time_point);

// A vector width and the FLOP per cycle of the cores we know at it: zmm 32 (Zen 4 runs it as two
// halves) or 64 (Intel, Zen 5); ymm 16 (Zen 1 runs it as two halves) or 32.
struct Width {
  const char* isa;
  Kernel kernel;
  double lowestPeak, highestPeak; // FLOP per cycle
};

// Every vector width this CPU runs FMAs on, widest first; with `bf16`, vdpbf16ps on zmm alone
// (none where the CPU has no AVX512_BF16).
std::vector<Width> availableWidths(bool bf16) {
  std::vector<Width> widths;
#ifdef FMA_PEAK_X86
  __builtin_cpu_init();
  if (bf16) {
    if (__builtin_cpu_supports("avx512bf16"))
      widths.push_back({"avx512bf16", kernelBf16, 64, 128});
    return widths;
  }
  if (__builtin_cpu_supports("avx512f"))
    widths.push_back({"avx512f", kernelAvx512, 32, 64});
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    widths.push_back({"avx2+fma", kernelAvx2, 16, 32});
#else
  if (bf16)
    return widths;
#endif
  if (widths.empty())
    widths.push_back({"generic", kernelGeneric, 0, 0});
  return widths;
}

struct Run {
  double gflops = 0;
  double ghz = 0; // the threads' mean clock, measured just before
};

// One run: each of `threads` threads measures its clock, then they start together, loop for
// `ms`, and the flops of all of them are divided by the wall time from the common start to the
// last one's end.
Run runOnce(Kernel kernel, int threads, int ms, float seed, bool* ok) {
  // The main thread waits for the clocks on a condition variable: a spinning or polling thread
  // would take cycles from the clocks it waits for.
  std::mutex mutex;
  std::condition_variable measured;
  int ready = 0;
  std::atomic<bool> go{false};
  std::vector<Result> results(threads);
  std::vector<double> clocks(threads);
  std::vector<std::thread> pool;
  Clock::time_point start;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      clocks[t] = measureGhz(std::max(ms / 4, 10));
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++ready;
      }
      measured.notify_one();
      while (!go.load(std::memory_order_acquire)) {
      }
      results[t] =
          kernel(seed + 0.01f * static_cast<float>(t), start + std::chrono::milliseconds(ms));
    });
  {
    std::unique_lock<std::mutex> lock(mutex);
    measured.wait(lock, [&] { return ready == threads; });
  }
  start = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool)
    th.join();
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  Run run;
  double flops = 0;
  for (int t = 0; t < threads; ++t) {
    flops += results[t].flops;
    run.ghz += clocks[t] / threads;
    if (!(std::fabs(results[t].checksum - 1.0) < 1e-2)) // the chains' fixed point is 1
      *ok = false;
  }
  run.gflops = flops / seconds * 1e-9;
  return run;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

[[noreturn]] void usage(int code) {
  std::fprintf(
      code ? stderr : stdout,
      "usage: fma_peak [--threads N] [--ms MS] [--runs R] [--check] [--bf16]\n"
      "Measures the fp32 FMA peak with N threads (default 1) on every vector width the CPU "
      "has, each run MS ms long (default 200), and prints the better width's median of R "
      "runs (default 5), the clock and FLOP per cycle as JSON.\n"
      "--check: exit 1 unless a run of the better width reads, by the clock measured before "
      "it, from half the lowest to 115%% of the highest FLOP per cycle of the cores we know "
      "at that width (zmm: 32-64, so 16-73.6; ymm: 16-32, so 8-36.8): a meter that reads "
      "its own clock consistently, whatever share of the FMA ports a neighbour takes.\n"
      "--bf16: vdpbf16ps instead (AVX512_BF16; 64-128 FLOP per cycle on the cores we know); "
      "exits 77 where the CPU has none.\n");
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
  bool check = false, bf16 = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help")
      usage(0);
    if (a == "--check") {
      check = true;
      continue;
    }
    if (a == "--bf16") {
      bf16 = true;
      continue;
    }
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

  // Not a constant the compiler could see through: the chains start from the argument count.
  const float seed = 0.5f + 0.001f * static_cast<float>(argc);
  bool ok = true;
  std::string widthsJson;
  double best = 0, bestGhz = 0;
  std::vector<double> bestRuns, bestRunsPerCycle; // the best width's runs, each by its own clock
  const Width* bestWidth = nullptr;
  const std::vector<Width> widths = availableWidths(bf16);
  if (widths.empty()) {
    std::fprintf(stderr, "fma_peak: this CPU has no AVX512_BF16 (vdpbf16ps): no bf16 peak\n");
    return 77;
  }
  for (const Width& width : widths) {
    std::vector<double> gflops, ghz, perCycle;
    for (int r = 0; r < runs; ++r) {
      Run run = runOnce(width.kernel, threads, ms, seed, &ok);
      gflops.push_back(run.gflops);
      ghz.push_back(run.ghz);
      perCycle.push_back(run.gflops / threads / run.ghz);
    }
    double g = median(gflops), clock = median(ghz);
    // Each width's best run too: bench/compare --isa avx2 meters AVX2 code against the ymm one.
    const double most = *std::max_element(gflops.begin(), gflops.end());
    char entry[320];
    std::snprintf(entry, sizeof entry,
                  "%s{\"isa\":\"%s\",\"gflops\":%.6g,\"max_gflops\":%.6g,"
                  "\"flop_per_cycle\":%.4g,\"ghz\":%.4g}",
                  widthsJson.empty() ? "" : ",", width.isa, g, most, g / threads / clock, clock);
    widthsJson += entry;
    if (g > best) {
      best = g;
      bestGhz = clock;
      bestRuns = gflops;
      bestRunsPerCycle = perCycle;
      bestWidth = &width;
    }
  }
  if (!ok) {
    std::fprintf(stderr, bf16 ? "fma_peak: the vdpbf16ps chains' lanes left (0, 4]; the loop "
                                "was miscompiled or cut short\n"
                              : "fma_peak: the FMA chains did not reach their fixed point; the "
                                "loop was miscompiled or cut short\n");
    return 1;
  }
  std::sort(bestRuns.begin(), bestRuns.end());
  std::printf("{\"engine\":\"fma_peak\",\"threads\":%d,\"gflops\":%.6g,\"min_gflops\":%.6g,"
              "\"max_gflops\":%.6g,\"per_thread_gflops\":%.6g,\"isa\":\"%s\",\"ghz\":%.4g,"
              "\"flop_per_cycle\":%.4g,\"widths\":[%s],\"ms\":%d,\"runs\":%d,"
              "\"hardware_threads\":%u}\n",
              threads, best, bestRuns.front(), bestRuns.back(), best / threads, bestWidth->isa,
              bestGhz, best / threads / bestGhz, widthsJson.c_str(), ms, runs,
              std::thread::hardware_concurrency());
  if (check && bestWidth->highestPeak > 0) {
    // The cores we know run this width at lowestPeak to highestPeak FLOP per cycle. The clock is
    // the integer chain's, which the FMA loop need not share: Intel cores run heavy AVX-512 code
    // at a lower clock, and in a VM a neighbour on the same physical core can hold part of the
    // FMA ports for minutes while the integer chain runs undisturbed (every one of 70 runs over
    // 3 s read 43.5-47.1 FLOP per cycle on the Intel VM's zmm, in CI). So a run reads plausibly
    // when it is at most 15% above the highest peak (a clock measured low, or work counted
    // twice, reads above it) and at least half the lowest (work that does not run as vector
    // FMAs of this width reads below it). Each run is judged by the clock measured just before
    // it, and one plausible run passes. Whether the meter reads the peak rather than less is
    // checked against real work: tests/fma_peak_vs_tile.py (the generated GEMM tile in L1), and
    // bench/compare, which refuses a table in which an engine runs above the meter.
    auto plausible = [&](double perCycle) {
      return perCycle >= 0.5 * bestWidth->lowestPeak && perCycle <= 1.15 * bestWidth->highestPeak;
    };
    if (std::none_of(bestRunsPerCycle.begin(), bestRunsPerCycle.end(), plausible)) {
      std::string each;
      for (double perCycle : bestRunsPerCycle) {
        char reading[32];
        std::snprintf(reading, sizeof reading, "%s%.1f", each.empty() ? "" : ", ", perCycle);
        each += reading;
      }
      std::fprintf(stderr,
                   "fma_peak: %.1f FLOP per cycle (%.1f GFLOP/s at %.2f GHz; each run by its own "
                   "clock: %s) is outside %.0f-%.0f, what the cores we know do at %s: the meter "
                   "or the clock measurement is off\n",
                   best / threads / bestGhz, best / threads, bestGhz, each.c_str(),
                   0.5 * bestWidth->lowestPeak, 1.15 * bestWidth->highestPeak, bestWidth->isa);
      return 1;
    }
  }
  return 0;
}

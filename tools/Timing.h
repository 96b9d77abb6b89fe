// Timing for `rnnc bench`: medians of repeats, as machines here are shared and noisy.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <numeric>
#include <utility>
#include <vector>

#include <unistd.h>

namespace rnnc::tools {

// Progress of a long measurement on stderr: once it has run for 2 s, and only when stderr is a
// terminal (never in logs, pipes or tests), one line rewritten in place, erased when done.
class Progress {
public:
  static Progress& get() {
    static Progress progress;
    return progress;
  }
  // Run `run` of `runs` of the measurement number `measurement` is done.
  void update(int measurement, int run, int runs) {
    if (!terminal_)
      return;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (seconds < 2.0)
      return;
    std::fprintf(stderr, "\r\033[Krnnc: measurement %d, run %d of %d, %.0f s", measurement, run,
                 runs, seconds);
    shown_ = true;
  }
  // Erases the line before the results are printed.
  void clear() {
    if (shown_)
      std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }
  int nextMeasurement() { return ++measurements_; }

private:
  Progress() : terminal_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}
  bool terminal_, shown_ = false;
  int measurements_ = 0;
  std::chrono::steady_clock::time_point start_;
};

struct Timing {
  // Milliseconds. The mean is the throughput of back-to-back calls: where a few calls are
  // slow (a thread preempted by another process), it shows what the median hides.
  double median = 0, min = 0, max = 0, mean = 0;
};

inline Timing summarise(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  size_t n = ms.size();
  double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  return {median, ms.front(), ms.back(), std::accumulate(ms.begin(), ms.end(), 0.0) / n};
}

template <class F> double timeOnce(F&& body) {
  auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Several bodies, run in turn within each repeat, so that a slow minute of a shared machine
// falls on all of them alike and their ratios stay fair. `prepare`, if given, runs untimed
// before every call of a body: what a caller has ready before it calls.
inline std::vector<Timing> timeInterleaved(int warmup, int repeat,
                                           const std::vector<std::function<void()>>& bodies,
                                           const std::function<void()>& prepare = {}) {
  auto ready = [&] {
    if (prepare)
      prepare();
  };
  for (int i = 0; i < warmup; ++i)
    for (const auto& body : bodies) {
      ready();
      body();
    }
  std::vector<std::vector<double>> ms(bodies.size());
  const int measurement = Progress::get().nextMeasurement();
  for (int i = 0; i < repeat; ++i) {
    for (size_t b = 0; b < bodies.size(); ++b) {
      ready();
      ms[b].push_back(timeOnce(bodies[b]));
    }
    Progress::get().update(measurement, i + 1, repeat);
  }
  Progress::get().clear();
  std::vector<Timing> timings;
  for (auto& samples : ms)
    timings.push_back(summarise(std::move(samples)));
  return timings;
}

template <class F> Timing timeRepeats(int warmup, int repeat, F&& body) {
  return timeInterleaved(warmup, repeat, {std::function<void()>(std::forward<F>(body))})[0];
}

template <class P, class F> Timing timeRepeats(int warmup, int repeat, P&& prepare, F&& body) {
  return timeInterleaved(warmup, repeat, {std::function<void()>(std::forward<F>(body))},
                         std::function<void()>(std::forward<P>(prepare)))[0];
}

} // namespace rnnc::tools

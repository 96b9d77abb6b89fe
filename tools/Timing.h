// Timing for `rnnc bench`: medians of repeats, as machines here are shared and noisy.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>
#include <vector>

namespace rnnc::tools {

struct Timing {
  double median = 0, min = 0, max = 0; // milliseconds
};

inline Timing summarise(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  size_t n = ms.size();
  double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  return {median, ms.front(), ms.back()};
}

template <class F> double timeOnce(F&& body) {
  auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Several bodies, run in turn within each repeat, so that a slow minute of a shared machine
// falls on all of them alike and their ratios stay fair.
inline std::vector<Timing> timeInterleaved(int warmup, int repeat,
                                           const std::vector<std::function<void()>>& bodies) {
  for (int i = 0; i < warmup; ++i)
    for (const auto& body : bodies)
      body();
  std::vector<std::vector<double>> ms(bodies.size());
  for (int i = 0; i < repeat; ++i)
    for (size_t b = 0; b < bodies.size(); ++b)
      ms[b].push_back(timeOnce(bodies[b]));
  std::vector<Timing> timings;
  for (auto& samples : ms)
    timings.push_back(summarise(std::move(samples)));
  return timings;
}

template <class F> Timing timeRepeats(int warmup, int repeat, F&& body) {
  return timeInterleaved(warmup, repeat, {std::function<void()>(std::forward<F>(body))})[0];
}

} // namespace rnnc::tools

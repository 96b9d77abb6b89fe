// Timing for `rnnc bench`: medians of repeats, as machines here are shared and noisy.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace rnnc::tools {

struct Timing {
  double median = 0, min = 0, max = 0; // milliseconds
};

template <class F> Timing timeRepeats(int warmup, int repeat, F&& body) {
  for (int i = 0; i < warmup; ++i)
    body();
  std::vector<double> ms;
  for (int i = 0; i < repeat; ++i) {
    auto start = std::chrono::steady_clock::now();
    body();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  size_t n = ms.size();
  double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  return {median, ms.front(), ms.back()};
}

} // namespace rnnc::tools

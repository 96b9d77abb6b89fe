#include "runtime/threads/WorkBalance.h"

#include "ir/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <string>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace rnnc {
namespace {

// What one measurement spans: at least 4 intervals between barriers (a step has one to three)
// and 2^24 time stamp ticks (about 5 ms) of work on some thread. Over 0.6 ms the two threads'
// times for equal work differed by up to 10% from one measurement to the next (a tanh RNN,
// B=64 H=512, Zen 5 VM), and the shares wandered to 57/43 after that noise; each block that
// moves has its weights read again from the other core's cache.
constexpr int kIntervals = 4;
constexpr uint64_t kTicks = uint64_t{1} << 24;
// Times within 5% of each other are balanced: moving work for less trades its cache for noise.
constexpr double kBalanced = 0.05;

// The time stamp counter: a few cycles to read, where a clock_gettime per barrier was a
// percent of a batch-1 step. Its rate is the same on every core (constant_tsc); only ratios
// of times are used.
uint64_t now() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

std::vector<double> normalised(std::vector<double> shares) {
  const double sum = std::accumulate(shares.begin(), shares.end(), 0.0);
  for (double& s : shares)
    s /= sum;
  return shares;
}

// RNNC_THREAD_SHARES: `equal`, or one positive fraction per thread.
std::vector<double> fixedShares(const char* text, int threads) {
  if (std::string(text) == "equal")
    return std::vector<double>(static_cast<size_t>(threads), 1.0 / threads);
  std::vector<double> shares;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const double value = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(value > 0) || !std::isfinite(value))
      throw UserError(fmt::format("RNNC_THREAD_SHARES='{}': '{}' is not a positive fraction "
                                  "(give `equal` or one fraction per thread, such as 0.4,0.6)",
                                  text, item));
    shares.push_back(value);
  }
  if (static_cast<int>(shares.size()) != threads)
    throw UserError(fmt::format("RNNC_THREAD_SHARES='{}' gives {} shares for a run on {} threads",
                                text, shares.size(), threads));
  return normalised(std::move(shares));
}

} // namespace

std::vector<double> rebalancedShares(const std::vector<double>& shares,
                                     const std::vector<double>& busy) {
  const size_t n = shares.size();
  if (n < 2 || std::any_of(busy.begin(), busy.end(), [](double t) { return !(t > 0); }))
    return shares;
  const auto [fastest, slowest] = std::minmax_element(busy.begin(), busy.end());
  if (*slowest - *fastest <= kBalanced * *slowest)
    return shares;
  std::vector<double> speed(n);
  for (size_t t = 0; t < n; ++t)
    speed[t] = shares[t] / busy[t];
  const double total = std::accumulate(speed.begin(), speed.end(), 0.0);
  const double equal = 1.0 / static_cast<double>(n);
  std::vector<double> next(n);
  for (size_t t = 0; t < n; ++t) {
    const double balanced = speed[t] / total;
    next[t] = std::clamp(shares[t] + 0.5 * (balanced - shares[t]), 0.5 * equal, 1.5 * equal);
  }
  return normalised(std::move(next));
}

WorkBalance::WorkBalance(int threads)
    : threads_(threads), clocks_(static_cast<size_t>(threads)),
      boundaries_(static_cast<size_t>(threads) + 1) {
  std::vector<double> shares(static_cast<size_t>(threads), 1.0 / threads);
  if (const char* text = std::getenv("RNNC_THREAD_SHARES"); text && *text) {
    shares = fixedShares(text, threads);
    adaptive_ = false;
  }
  setShares(shares);
}

void WorkBalance::setShares(const std::vector<double>& shares) {
  for (int t = 0; t < threads_; ++t)
    boundaries_[static_cast<size_t>(t) + 1] =
        boundaries_[static_cast<size_t>(t)] + shares[static_cast<size_t>(t)];
  boundaries_.back() = 1.0; // not a sum's rounding
}

void WorkBalance::workStarted(int thread) {
  clocks_[static_cast<size_t>(thread)].startedAt = now();
}

void WorkBalance::workStopped(int thread) {
  Clock& clock = clocks_[static_cast<size_t>(thread)];
  clock.busy += now() - clock.startedAt;
}

void WorkBalance::allArrived() {
  if (!adaptive_ || ++intervals_ < kIntervals)
    return;
  if (std::none_of(clocks_.begin(), clocks_.end(), [](const Clock& c) { return c.busy >= kTicks; }))
    return;
  intervals_ = 0;
  std::vector<double> busy(static_cast<size_t>(threads_));
  for (int t = 0; t < threads_; ++t) {
    busy[static_cast<size_t>(t)] = static_cast<double>(clocks_[static_cast<size_t>(t)].busy);
    clocks_[static_cast<size_t>(t)].busy = 0;
  }
  setShares(rebalancedShares(shares(), busy));
}

int64_t WorkBalance::start(int thread, int64_t total) const {
  if (thread <= 0)
    return 0;
  if (thread >= threads_)
    return total;
  return std::min<int64_t>(
      total, std::llround(boundaries_[static_cast<size_t>(thread)] * static_cast<double>(total)));
}

std::vector<double> WorkBalance::shares() const {
  std::vector<double> result(static_cast<size_t>(threads_));
  for (int t = 0; t < threads_; ++t)
    result[static_cast<size_t>(t)] =
        boundaries_[static_cast<size_t>(t) + 1] - boundaries_[static_cast<size_t>(t)];
  return result;
}

} // namespace rnnc

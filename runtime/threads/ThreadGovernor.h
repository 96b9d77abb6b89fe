// How many threads a run with an automatic thread count uses. By default every core this
// process may run on; but when another process takes cores, a run split across all of them
// waits at every step for a thread that is not running (a batch-1 LSTM on 2 threads of 2 busy
// cores took 6 ms instead of 1.5 ms, against 3.5 ms on one thread). Teams measure the time
// their threads sleep at barriers (runtime/threads/ThreadTeam.h); a run that slept a fifth of its
// time reports it, and later automatic runs use one thread fewer. After a back-off (at
// least 4 runs' time) the governor probes one thread more; a probe that oversubscribes again
// doubles the back-off.
// A call too short to pay for a team (starting its threads, waking them) runs on one thread:
// its caller estimates what one thread would take, and below kWorthATeam it gets a team only
// where one of that size is idle already, or after kSmallCallsBeforeATeam such calls (a
// process that keeps making them, a server, keeps its team warm and gains from it). In a VM,
// a whole `rnnc run` of a T=100 B=1 H=256 LSTM (about 1.5 ms of work on one thread) took 8.2
// ms at the median and 13.6 at the 90th percentile on two threads, 6.8 and 8.9 on one: waking
// the other virtual CPU for the packing and the run cost more than the split saved.
// An explicit thread count is always used as given.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>

namespace rnnc {

class ThreadGovernor {
public:
  using Clock = std::chrono::steady_clock;

  // `now` is injectable for tests.
  explicit ThreadGovernor(std::function<Clock::time_point()> now = Clock::now);

  // The process-wide governor used by CompiledCell for automatic runs.
  static ThreadGovernor& shared();

  // Threads for a run that may use up to `most`, which one thread would take about `oneThread`
  // to do, and for which a team of `most` threads is idle (`teamIdle`) or would have to start.
  int threadsFor(int most, Clock::duration oneThread = Clock::duration::max(),
                 bool teamIdle = true);

  // After a run on `threads` threads that took `wall` and whose threads slept `slept` in all
  // at barriers (the whole call: every phase and, for variable lengths, every stretch).
  void report(int threads, Clock::duration wall, Clock::duration slept);

  // A run is oversubscribed when its threads slept more than this share of their time.
  // Unloaded: 0-3% at the default size, 0-14% at batch 1; with one of 2 cores taken: 24-29%.
  static constexpr double kOversubscribedShare = 0.2;
  // Shorter runs tell nothing: waking a team's sleeping threads alone takes tens of
  // microseconds, which their barriers would count as sleep.
  static constexpr Clock::duration kShortestTelling = std::chrono::microseconds(200);
  // Back-offs: the longer of a time and a number of runs as long as the one that reported.
  static constexpr Clock::duration kFirstBackOff = std::chrono::milliseconds(50);
  static constexpr Clock::duration kLongestBackOff = std::chrono::seconds(2);
  static constexpr int kFirstBackOffRuns = 4;
  static constexpr int kLongestBackOffRuns = 32;
  // Calls shorter than this on one thread start no team of their own.
  static constexpr Clock::duration kWorthATeam = std::chrono::milliseconds(2);
  static constexpr int kSmallCallsBeforeATeam = 8;

private:
  std::function<Clock::time_point()> now_;
  std::mutex mutex_;
  int cap_ = 0; // the most threads automatic runs use; 0: no cap
  Clock::time_point probeAfter_{};
  Clock::duration backOff_ = kFirstBackOff;
  int smallCalls_ = 0; // short calls kept on one thread so far
};

} // namespace rnnc

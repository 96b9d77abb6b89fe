// How many threads a run with an automatic thread count uses. By default every core this
// process may run on; but when another process takes cores, a run split across all of them
// waits at every step for a thread that is not running (a batch-1 LSTM on 2 threads of 2 busy
// cores took 6 ms instead of 1.5 ms, against 3.5 ms on one thread). Teams measure the time
// their threads sleep at barriers (runtime/threads/ThreadTeam.h); a run that slept a fifth of its
// time reports it, and later automatic runs use one thread fewer. After a back-off (at
// least 4 runs' time) the governor probes one thread more; a probe that oversubscribes again
// doubles the back-off.
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

  // Threads for a run that may use up to `most`.
  int threadsFor(int most);

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

private:
  std::function<Clock::time_point()> now_;
  std::mutex mutex_;
  int cap_ = 0; // the most threads automatic runs use; 0: no cap
  Clock::time_point probeAfter_{};
  Clock::duration backOff_ = kFirstBackOff;
};

} // namespace rnnc

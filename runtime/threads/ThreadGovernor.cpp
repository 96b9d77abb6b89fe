#include "runtime/threads/ThreadGovernor.h"

#include "runtime/threads/ForkSafety.h"

#include <algorithm>

namespace rnnc {

ThreadGovernor::ThreadGovernor(std::function<Clock::time_point()> now) : now_(std::move(now)) {}

ThreadGovernor& ThreadGovernor::shared() {
  static ThreadGovernor governor;
  static const HeldAcrossFork forkHold(governor.mutex_);
  return governor;
}

int ThreadGovernor::threadsFor(int most, Clock::duration oneThread, bool teamIdle) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (most > 1 && oneThread < kWorthATeam && !teamIdle && smallCalls_ < kSmallCallsBeforeATeam) {
    ++smallCalls_;
    return 1;
  }
  if (cap_ == 0 || most <= cap_)
    return most;
  if (now_() >= probeAfter_) // try one thread more; report() keeps or drops it
    return cap_ + 1;
  return cap_;
}

void ThreadGovernor::report(int threads, Clock::duration wall, Clock::duration slept) {
  if (threads <= 1 || wall < kShortestTelling)
    return;
  const bool oversubscribed =
      std::chrono::duration<double>(slept).count() >
      kOversubscribedShare * threads * std::chrono::duration<double>(wall).count();
  std::lock_guard<std::mutex> lock(mutex_);
  if (oversubscribed) {
    // A failed probe (or a first sign) backs off longer each time in a row.
    // Back-offs last several runs of this length, so that probes (each an oversubscribed
    // run) stay a small share however long the runs are.
    const bool again = cap_ != 0 && threads > cap_;
    cap_ = cap_ == 0 ? threads - 1 : std::min(cap_, threads - 1);
    const Clock::duration first =
        std::max<Clock::duration>(kFirstBackOff, kFirstBackOffRuns * wall);
    const Clock::duration longest =
        std::max<Clock::duration>(kLongestBackOff, kLongestBackOffRuns * wall);
    backOff_ = again ? std::min(std::max(2 * backOff_, first), longest) : first;
    probeAfter_ = now_() + backOff_;
    return;
  }
  if (cap_ != 0 && threads > cap_) { // a probe that went well
    cap_ = threads;
    backOff_ = kFirstBackOff;
    probeAfter_ = now_(); // and the next one may go on up at once
  }
}

} // namespace rnnc

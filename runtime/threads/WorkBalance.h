// How the threads of a team divide the work that may move between them from one step to the
// next: the column blocks of a recurrent product (codegen: EmitContext::balancedShare). Split
// in equal parts, every step waits for its slowest thread, and threads are not alike: a VM's
// two vCPUs ran the same walk 22% apart (perf, LSTM I=H=1024 on 2 threads: the faster thread
// spent 7% of the run in the barrier), big and little cores differ more, and thread 0 does the
// step's serial work alone. So each thread's share follows its measured speed: the time it
// spends on its share (the generated code stops a clock around it), summed over a few barriers
// and at least ~5 ms, and the shares moved halfway to where those times would have been
// equal. Only the movable work is timed: a step's whole time between barriers, where fixed
// work (copies, cache misses on the other thread's rows) dominates, as at batch 1, did not
// shrink with the share, and the shares drifted to 60/40, 8% slower than equal ones.
//
// RNNC_THREAD_SHARES fixes the shares instead: `equal` (the static split), or fractions, one
// per thread ("0.3,0.7", normalised), for measuring and for tests.
#pragma once

#include <cstdint>
#include <vector>

namespace rnnc {

// The shares after one measurement: `shares` (fractions summing to 1) and the time each thread
// worked on its share, moved halfway to shares proportional to each thread's speed (share over
// time), each kept within half and one and a half of an equal share so that no thread's share
// can vanish and never be measured again. Times within 5% of each other, or a thread that
// reported no time, keep the shares as they are.
std::vector<double> rebalancedShares(const std::vector<double>& shares,
                                     const std::vector<double>& busy);

class WorkBalance {
public:
  // The shares RNNC_THREAD_SHARES sets, equal shares if unset; UserError for a bad value.
  explicit WorkBalance(int threads);

  // `thread` starts and stops work on its share.
  void workStarted(int thread);
  void workStopped(int thread);
  // Every thread has arrived (called by the last one, alone, before it releases the others).
  void allArrived();

  // Where `thread`'s part of [0, total) starts; `threads` gives total. The same for every
  // thread between two barriers, since shares change only inside one.
  int64_t start(int thread, int64_t total) const;
  std::vector<double> shares() const;
  bool adaptive() const { return adaptive_; }

private:
  void setShares(const std::vector<double>& shares);
  struct alignas(64) Clock {
    uint64_t startedAt = 0;
    uint64_t busy = 0;
  };
  const int threads_;
  bool adaptive_ = true;
  std::vector<Clock> clocks_;
  std::vector<double> boundaries_; // where each thread's share starts, and 1 at the end
  int intervals_ = 0;
};

} // namespace rnnc

// Threads that run one compiled sequence together. The generated code splits every step
// between them and meets at rnnc_barrier about once a step, so the barrier must cost well under
// a microsecond while every thread has a core; when another process takes a core, a
// waiter stops spinning after a bounded time and sleeps on a futex (std::atomic::wait), so an
// oversubscribed run slows down instead of burning its time slices.
//
// Teams are kept for reuse (starting threads costs tens of microseconds, a step of a batch-1
// sequence about ten): TeamPool::acquire hands out an idle team of the requested size, or makes
// one, so concurrent forward calls each get their own. How many threads an automatic run
// uses is runtime/threads/ThreadGovernor.h's decision.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/threads/WorkBalance.h"

namespace rnnc {

// A reusable barrier for a fixed number of threads. The last thread to arrive, alone, lets the
// team's WorkBalance divide the movable work anew from what its threads timed.
class Barrier {
public:
  explicit Barrier(int threads);
  void arriveAndWait();
  WorkBalance& balance() { return balance_; }
  const WorkBalance& balance() const { return balance_; }
  // Rounds completed so far (wraps).
  uint32_t generation() const { return generation_.load(std::memory_order_acquire); }
  // The time its threads have waited in it past a short spin (spinning on, yielding to a
  // teammate on their core, then asleep) since the last call, all added up: what tells
  // ThreadGovernor that a run was oversubscribed.
  std::chrono::nanoseconds takeSlept();
  // The calling team thread notes the core it runs on; whether another team thread was last
  // noted on the caller's core (then a waiter yields to it now and then).
  void recordCpu();
  // The same, and which system thread it is (where teammates read its core from).
  void recordThread();
  bool teammateOnMyCpu() const;
  // Notes the core each teammate runs on now, or last ran on if it waits (from /proc).
  void refreshTeammatesCpus();
  // Moves the calling thread to a core of its affinity mask where no teammate was noted (the
  // mask is left as it was: the thread stays where it moved until the scheduler moves it);
  // false where there is none or the system refused.
  bool moveOffTeammatesCpus();
  // How many times a thread of this team moved itself.
  int64_t moves() const { return moves_.load(std::memory_order_relaxed); }

private:
  const int threads_;
  WorkBalance balance_;
  std::atomic<int> arrived_{0};
  std::atomic<uint32_t> generation_{0};
  std::atomic<int64_t> sleptNs_{0};
  std::unique_ptr<std::atomic<int>[]> cpus_; // each team thread's core when last noted
  std::unique_ptr<std::atomic<int>[]> tids_; // each team thread's system thread id (gettid)
  std::atomic<int64_t> moves_{0};
};

class ThreadTeam {
public:
  // Throws UserError, with every thread it started stopped again, when the system cannot start
  // them all (thread limits, memory for their stacks).
  explicit ThreadTeam(int threads,
                      std::chrono::nanoseconds moveBelowRound = kDefaultMoveBelowRound);
  // A worker woken for a run on its caller's core moves to another where the team's last run
  // met at barriers at least this often (ThreadTeam::work says why).
  static constexpr std::chrono::nanoseconds kDefaultMoveBelowRound{50'000};
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  int size() const { return size_; }
  // Runs job(thread) on every thread of the team, the caller being thread 0, and returns when
  // all are done. Not reentrant: one run at a time per team.
  void run(const std::function<void(int thread)>& job);
  Barrier& barrier() { return barrier_; }

private:
  void work(int thread);
  void stopWorkers();

  const int size_;
  const int64_t moveBelowRoundNs_;
  Barrier barrier_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint32_t> started_{0}; // generation of the current job
  std::atomic<int> finished_{0};     // workers done with it
  std::atomic<bool> stopping_{false};
  // The last run's time over its barrier rounds (+1): how often its threads met (0: no run yet).
  std::atomic<int64_t> lastRoundNs_{0};
  std::vector<std::thread> workers_;
};

// Idle teams by size.
class TeamPool {
public:
  // The process's pool. A child of fork() starts with none of its idle teams: their threads
  // were the parent's, and the child has none of them (fork copies only the thread that calls
  // it), so a run on one would wait at its first barrier forever; the child starts teams of its
  // own. (A DataLoader worker or a multiprocessing pool that forks a process which has run rnnc
  // on several threads.)
  static TeamPool& shared();

  // Whether a team of `threads` threads is idle, its threads started.
  bool hasIdle(int threads);

  // A team lent to one run; back to the pool when the lease ends.
  struct Lease {
    Lease(TeamPool* pool, std::unique_ptr<ThreadTeam> team) : pool(pool), team(std::move(team)) {}
    Lease(Lease&&) = default;
    ~Lease();
    TeamPool* pool;
    std::unique_ptr<ThreadTeam> team;
  };
  Lease acquire(int threads);

private:
  // In the child of a fork(), with the pool held (runtime/threads/ForkSafety.h): lets go of
  // the parent's idle teams.
  static void forgetParentsTeams();

  std::mutex mutex_;
  std::vector<std::unique_ptr<ThreadTeam>> idle_;
};

// The threads a run uses by default: the cores this process may run on.
int defaultThreadCount();

// The most threads a run may ask for: 4 per hardware thread (at least 8), or what the
// environment variable RNNC_MAX_THREADS says. More is never faster (every step is split between
// them and they meet at a barrier each step), and thousands only exhaust memory or the
// system's thread limit.
int maxThreadCount();
// A requested thread count (0: automatic) checked against it; UserError otherwise.
void checkThreadCount(int threads);

} // namespace rnnc

// The generated code's barrier: `team` is the ThreadTeam's Barrier.
extern "C" void rnnc_barrier(void* team);
// Where `thread`'s part of [0, total) movable blocks starts (thread == threads: total), as the
// team's WorkBalance divides it; with no team (one thread), 0 for thread 0, else total.
extern "C" int64_t rnnc_share_start(void* team, int64_t thread, int64_t total);
// `thread` starts (stop = 0) or stops (1) work on its share; nothing without a team.
extern "C" void rnnc_share_clock(void* team, int64_t thread, int64_t stop);

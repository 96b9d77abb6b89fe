// The thread teams and barrier the generated code runs on: every thread sees every other
// thread's writes from before a barrier, rounds never mix, and oversubscribed teams (more
// threads than this machine's cores, so waiters must sleep) finish.
#include "ir/Error.h"
#include "runtime/threads/ThreadGovernor.h"
#include "runtime/threads/ThreadTeam.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>

using namespace rnnc;

namespace {

void expectLockstep(int threads, int rounds) {
  ThreadTeam team(threads);
  std::vector<int> seen(static_cast<size_t>(threads), -1);
  std::atomic<int> mismatches{0};
  team.run([&](int thread) {
    for (int round = 0; round < rounds; ++round) {
      seen[static_cast<size_t>(thread)] = round; // plain writes: the barrier must publish them
      team.barrier().arriveAndWait();
      for (int other = 0; other < threads; ++other)
        if (seen[static_cast<size_t>(other)] != round)
          mismatches.fetch_add(1);
      team.barrier().arriveAndWait(); // nobody writes the next round before all have read
    }
  });
  EXPECT_EQ(mismatches.load(), 0) << threads << " threads";
}

TEST(ThreadTeam, BarrierRoundsAreInLockstep) {
  expectLockstep(1, 100);
  expectLockstep(2, 2000);
  expectLockstep(5, 300); // more threads than cores: waiters sleep on the futex
}

TEST(ThreadTeam, TheBarrierAddsUpTheTimeItsThreadsSleep) {
  ThreadTeam team(2);
  team.barrier().takeSlept();
  team.run([&](int thread) {
    if (thread == 1) // far past the spinning: thread 0 sleeps about this long
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
    team.barrier().arriveAndWait();
  });
  std::chrono::nanoseconds slept = team.barrier().takeSlept();
  EXPECT_GE(slept, std::chrono::milliseconds(30));
  EXPECT_LT(slept, std::chrono::seconds(5));
  EXPECT_EQ(team.barrier().takeSlept(), std::chrono::nanoseconds(0)); // taken
  // (Threads that arrive together spin briefly and do not sleep, but only while both have a
  // core: under a parallel ctest they may, so that is not asserted here.)
}

// The cores this process may run on.
std::vector<int> allowedCpus() {
  cpu_set_t set;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set))
        cpus.push_back(cpu);
  return cpus;
}

void pinCallingThread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus)
    CPU_SET(cpu, &set);
  ASSERT_EQ(sched_setaffinity(0, sizeof(set), &set), 0);
}

// Whether each of a 2-thread team's threads, pinned to the cores given, sees its teammate on
// its own core at the barrier (where it yields its core to it while it waits).
// (Not a std::vector<bool>: its elements share one word, so the two threads' writes race.)
std::vector<int> teammatesOnMyCpu(int cpu0, int cpu1) {
  const std::vector<int> allowed = allowedCpus();
  pinCallingThread({cpu0});
  std::vector<int> seen(2);
  {
    ThreadTeam team(2); // its worker starts pinned to cpu0 as well
    team.run([&](int thread) {
      if (thread == 1)
        pinCallingThread({cpu1});
      team.barrier().arriveAndWait(); // both note their cores
      seen[static_cast<size_t>(thread)] = team.barrier().teammateOnMyCpu() ? 1 : 0;
      team.barrier().arriveAndWait();
    });
  }
  pinCallingThread(allowed);
  return seen;
}

// A waiter yields its core only to a teammate that runs there: two threads on one core must
// take turns (spinning alone, each waited its whole spin once a step: 42 ms for a 1 ms batch-1
// run), but a yield with the teammate elsewhere hands the core to another process.
TEST(ThreadTeam, TheBarrierKnowsWhetherATeammateSharesTheWaitersCore) {
  const std::vector<int> cpus = allowedCpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_EQ(teammatesOnMyCpu(cpus[0], cpus[0]), std::vector<int>({1, 1}));
  if (cpus.size() < 2)
    GTEST_SKIP() << "one core: threads on different cores cannot be checked";
  EXPECT_EQ(teammatesOnMyCpu(cpus[0], cpus[1]), std::vector<int>({0, 0}));
}

// A thread that finds a teammate on its core can move itself to another core of its mask, and
// leaves its mask as it was; pinned to the teammate's core alone, it stays.
TEST(ThreadTeam, AThreadMovesOffItsTeammatesCoreKeepingItsMask) {
  const std::vector<int> cpus = allowedCpus();
  if (cpus.size() < 2)
    GTEST_SKIP() << "one core: there is nowhere to move to";
  struct Outcome {
    int moved = -1, cpuAfter = -1, maskKept = 0;
  };
  // Thread 1 moves while thread 0 waits beside it, pinned to cpus[0]; thread 1 notes cpus[0]
  // while pinned there too, then moves with `mask` (so the scheduler has had no time to part
  // them itself).
  auto tryMove = [&](const std::vector<int>& mask) {
    Outcome outcome;
    pinCallingThread({cpus[0]});
    ThreadTeam team(2); // its worker starts on cpus[0] as well
    std::atomic<int> noted{0}, done{0};
    team.run([&](int thread) {
      team.barrier().recordCpu(); // cpus[0]
      noted.fetch_add(1);
      if (thread == 1) {
        while (noted.load() < 2)
          std::this_thread::yield();
        pinCallingThread(mask);
        outcome.moved = team.barrier().moveOffTeammatesCpus() ? 1 : 0;
        outcome.cpuAfter = sched_getcpu();
        outcome.maskKept = allowedCpus() == mask ? 1 : 0;
        done.store(1);
      } else {
        while (done.load() == 0)
          std::this_thread::yield();
      }
    });
    pinCallingThread(cpus);
    return outcome;
  };
  Outcome free = tryMove(cpus); // free to go anywhere: elsewhere, the mask kept
  EXPECT_EQ(free.moved, 1);
  EXPECT_NE(free.cpuAfter, cpus[0]);
  EXPECT_EQ(free.maskKept, 1);
  Outcome pinned = tryMove({cpus[0]}); // nowhere else to go, and the pin kept
  EXPECT_EQ(pinned.moved, 0);
  EXPECT_EQ(pinned.cpuAfter, cpus[0]);
  EXPECT_EQ(pinned.maskKept, 1);
}

// A worker woken for a run beside its caller moves to another core where the team's steps are
// short: two threads taking turns on one core would keep it (the scheduler leaves a thread that
// just ran where it is) while another core idles, a batch-1 run 4-8x slower.
TEST(ThreadTeam, AWorkerWokenOnItsCallersCoreMovesOff) {
  const std::vector<int> cpus = allowedCpus();
  if (cpus.size() < 2)
    GTEST_SKIP() << "one core: there is nowhere to move to";
  // A fresh team, its threads on cpus[0] and free to run anywhere: how many of 500 rounds its
  // threads ran apart, and whether the worker moved. Without the move they stay together.
  struct Outcome {
    int64_t moves;
    int spreadRounds;
  };
  auto movedApart = [&](std::chrono::nanoseconds moveBelowRound) {
    pinCallingThread({cpus[0]});
    ThreadTeam team(2, moveBelowRound);             // both on cpus[0]...
    team.run([&](int) { pinCallingThread(cpus); }); // ...and free to run anywhere
    pinCallingThread({cpus[0]}); // the caller stays on cpus[0] for the next run's start
    std::vector<int> cpu(2, -1);
    std::atomic<int> spreadRounds{0};
    team.run([&](int thread) {
      if (thread == 0)
        pinCallingThread(cpus);
      for (int round = 0; round < 500; ++round) {
        cpu[static_cast<size_t>(thread)] = sched_getcpu();
        team.barrier().arriveAndWait();
        if (thread == 0 && cpu[0] != cpu[1])
          spreadRounds.fetch_add(1);
        team.barrier().arriveAndWait();
      }
    });
    pinCallingThread(cpus);
    return Outcome{team.barrier().moves(), spreadRounds.load()};
  };
  // A team whose last run's rounds were longer than the threshold stays (1 ns: every run's).
  EXPECT_EQ(movedApart(std::chrono::nanoseconds(1)).moves, 0);
  // On a loaded machine (a parallel ctest) the scheduler may part the threads before the run
  // starts, and then there is nothing to move: try again. (Moving whatever the rounds' length,
  // which a loaded machine may make long.)
  for (int attempt = 0; attempt < 5; ++attempt) {
    const Outcome outcome = movedApart(std::chrono::hours(1));
    ASSERT_GT(outcome.spreadRounds, 0) << "the threads stayed on one core for 500 rounds";
    if (outcome.moves >= 1)
      return;
  }
  GTEST_SKIP() << "the scheduler parted the threads before every run: no move to check";
}

// The governor's policy on a clock the test moves by hand.
class GovernorTest : public ::testing::Test {
protected:
  using Clock = ThreadGovernor::Clock;
  Clock::time_point now{};
  ThreadGovernor governor{[this] { return now; }};
  static constexpr Clock::duration kRun = std::chrono::milliseconds(2);
  void reportRun(int threads, double sleptShare) {
    governor.report(threads, kRun,
                    std::chrono::duration_cast<Clock::duration>(kRun * threads * sleptShare));
  }
};

TEST_F(GovernorTest, UsesEveryCoreWhileRunsDoNotWaitForSleepingThreads) {
  EXPECT_EQ(governor.threadsFor(8), 8);
  reportRun(8, 0.05); // a little imbalance
  EXPECT_EQ(governor.threadsFor(8), 8);
  EXPECT_EQ(governor.threadsFor(1), 1);
}

TEST_F(GovernorTest, BacksOffAThreadWhenOversubscribedThenProbesBack) {
  reportRun(2, 0.5); // half the time asleep at barriers: a core is busy elsewhere
  EXPECT_EQ(governor.threadsFor(2), 1);
  now += ThreadGovernor::kFirstBackOff / 2;
  EXPECT_EQ(governor.threadsFor(2), 1);
  now += ThreadGovernor::kFirstBackOff;
  EXPECT_EQ(governor.threadsFor(2), 2); // the probe
  reportRun(2, 0.5);                    // still busy: back to one, for twice as long
  EXPECT_EQ(governor.threadsFor(2), 1);
  now += ThreadGovernor::kFirstBackOff + ThreadGovernor::kFirstBackOff / 2;
  EXPECT_EQ(governor.threadsFor(2), 1);
  now += ThreadGovernor::kFirstBackOff;
  EXPECT_EQ(governor.threadsFor(2), 2);
  reportRun(2, 0.0); // the core is free again
  EXPECT_EQ(governor.threadsFor(2), 2);
  EXPECT_EQ(governor.threadsFor(2), 2);
}

TEST_F(GovernorTest, BacksOffForSeveralRunsOfTheSameLength) {
  // A 1 s run: the back-off is 4 runs' time, not 50 ms, so probes stay rare.
  governor.report(2, std::chrono::seconds(1), std::chrono::seconds(1));
  now += std::chrono::seconds(3);
  EXPECT_EQ(governor.threadsFor(2), 1);
  now += std::chrono::seconds(1);
  EXPECT_EQ(governor.threadsFor(2), 2);
  governor.report(2, std::chrono::seconds(1), std::chrono::seconds(1)); // a failed probe: 8 s
  now += std::chrono::seconds(7);
  EXPECT_EQ(governor.threadsFor(2), 1);
  now += std::chrono::seconds(1);
  EXPECT_EQ(governor.threadsFor(2), 2);
}

// A call shorter than a team is worth runs on one thread, unless a team is idle already; one
// worth a team gets it.
TEST_F(GovernorTest, ShortCallsStartNoTeamButUseAnIdleOne) {
  const auto shortCall = ThreadGovernor::kWorthATeam / 2;
  EXPECT_EQ(governor.threadsFor(2, shortCall, /*teamIdle=*/false), 1);
  EXPECT_EQ(governor.threadsFor(2, shortCall, /*teamIdle=*/true), 2);
  EXPECT_EQ(governor.threadsFor(2, ThreadGovernor::kWorthATeam, /*teamIdle=*/false), 2);
  EXPECT_EQ(governor.threadsFor(1, shortCall, /*teamIdle=*/false), 1);
}

// A process that keeps making short calls (a server at batch 1) earns a team: kept warm by
// the calls, it pays for itself.
TEST_F(GovernorTest, AProcessThatKeepsMakingShortCallsGetsATeam) {
  const auto shortCall = std::chrono::microseconds(300);
  for (int i = 0; i < ThreadGovernor::kSmallCallsBeforeATeam; ++i)
    ASSERT_EQ(governor.threadsFor(4, shortCall, /*teamIdle=*/false), 1) << "call " << i;
  EXPECT_EQ(governor.threadsFor(4, shortCall, /*teamIdle=*/false), 4);
  // The oversubscription back-off still applies on top.
  reportRun(4, 0.5);
  EXPECT_EQ(governor.threadsFor(4, shortCall, /*teamIdle=*/true), 3);
}

TEST_F(GovernorTest, VeryShortRunsTellNothing) {
  governor.report(2, std::chrono::microseconds(100), std::chrono::microseconds(150));
  EXPECT_EQ(governor.threadsFor(2), 2);
}

TEST_F(GovernorTest, StepsDownOneThreadAtATimeAndBackUp) {
  reportRun(8, 0.4);
  EXPECT_EQ(governor.threadsFor(8), 7);
  reportRun(7, 0.4);
  EXPECT_EQ(governor.threadsFor(8), 6);
  reportRun(6, 0.1);
  EXPECT_EQ(governor.threadsFor(8), 6);
  now += ThreadGovernor::kFirstBackOff;
  EXPECT_EQ(governor.threadsFor(8), 7);
  reportRun(7, 0.0); // a good probe: the next may go on up at once
  EXPECT_EQ(governor.threadsFor(8), 8);
  reportRun(8, 0.0);
  EXPECT_EQ(governor.threadsFor(8), 8);
  // The back-off doubles on each failed probe in a row, up to its longest.
  reportRun(8, 0.9);
  for (int i = 0; i < 10; ++i) {
    now += ThreadGovernor::kLongestBackOff;
    ASSERT_EQ(governor.threadsFor(8), 8);
    reportRun(8, 0.9);
  }
  now += ThreadGovernor::kLongestBackOff - std::chrono::milliseconds(1);
  EXPECT_EQ(governor.threadsFor(8), 7);
}

TEST(ThreadTeam, RunsEveryThreadOncePerJobAndIsReusable) {
  ThreadTeam team(3);
  for (int job = 0; job < 50; ++job) {
    std::vector<std::atomic<int>> calls(3);
    team.run([&](int thread) { calls[static_cast<size_t>(thread)].fetch_add(1); });
    for (auto& c : calls)
      ASSERT_EQ(c.load(), 1);
  }
}

TEST(ThreadTeam, ThePoolLendsIdleTeamsAgain) {
  ThreadTeam* first = nullptr;
  {
    TeamPool::Lease lease = TeamPool::shared().acquire(2);
    first = lease.team.get();
    // A second lease while the first is out gets a team of its own.
    TeamPool::Lease other = TeamPool::shared().acquire(2);
    EXPECT_NE(other.team.get(), first);
  }
  TeamPool::Lease again = TeamPool::shared().acquire(2);
  EXPECT_TRUE(again.team.get() != nullptr);
  EXPECT_EQ(again.team->size(), 2);
}

TEST(ThreadTeam, DefaultThreadCountIsTheCoresWeMayUse) {
  EXPECT_GE(defaultThreadCount(), 1);
}

// A thread count is bounded: 4 per hardware thread unless RNNC_MAX_THREADS allows more; more is
// a UserError naming both numbers, not thousands of threads (20,000 on 2 cores once ran a
// 4-step sequence in 56 s) or an abort.
TEST(ThreadTeam, ThreadCountsAreBoundedUnlessTheEnvironmentAllowsMore) {
  const int most = std::max(8, 4 * static_cast<int>(std::thread::hardware_concurrency()));
  unsetenv("RNNC_MAX_THREADS");
  EXPECT_EQ(maxThreadCount(), most);
  EXPECT_NO_THROW(checkThreadCount(0));
  EXPECT_NO_THROW(checkThreadCount(most));
  try {
    checkThreadCount(most + 1);
    ADD_FAILURE() << "no error for " << most + 1 << " threads";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(most + 1) + " threads: at most " +
                                         std::to_string(most)),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(checkThreadCount(-1), UserError);
  setenv("RNNC_MAX_THREADS", "100000", 1);
  EXPECT_NO_THROW(checkThreadCount(100000));
  setenv("RNNC_MAX_THREADS", "lots", 1);
  EXPECT_THROW(maxThreadCount(), UserError);
  unsetenv("RNNC_MAX_THREADS");
}

// ---- Dividing movable work by each thread's speed (runtime/threads/WorkBalance.h) -----------

// One measurement moves the shares halfway to where the measured times would have been equal:
// thread 1 did its half in half the time, so it is twice as fast, and shares of 1/3 and 2/3
// would have balanced them.
TEST(WorkBalance, SharesMoveHalfwayToWhereTheTimesWouldBeEqual) {
  std::vector<double> next = rebalancedShares({0.5, 0.5}, {100, 50});
  EXPECT_NEAR(next[0], 0.5 + 0.5 * (1.0 / 3 - 0.5), 1e-12);
  EXPECT_NEAR(next[1], 0.5 + 0.5 * (2.0 / 3 - 0.5), 1e-12);
  // Repeated measurements of the same speeds converge there, until the times are within 5% of
  // each other, where the shares stay.
  std::vector<double> shares = {0.5, 0.5};
  for (int i = 0; i < 40; ++i)
    shares = rebalancedShares(shares, {shares[0] / 1.0, shares[1] / 2.0});
  EXPECT_NEAR(shares[0], 1.0 / 3, 0.02);
  EXPECT_NEAR(shares[1], 2.0 / 3, 0.02);
  EXPECT_EQ(rebalancedShares(shares, {shares[0] / 1.0, shares[1] / 2.0}), shares);
  EXPECT_EQ(rebalancedShares({0.5, 0.5}, {100, 96}), (std::vector<double>{0.5, 0.5}));
  // Three threads, the middle one slow: each gets a share near its speed's.
  shares = {1.0 / 3, 1.0 / 3, 1.0 / 3};
  for (int i = 0; i < 60; ++i)
    shares = rebalancedShares(shares, {shares[0], shares[1] / 0.8, shares[2]});
  EXPECT_NEAR(shares[1] / shares[0], 0.8, 0.05);
  EXPECT_NEAR(shares[0], shares[2], 1e-12);
  EXPECT_NEAR(shares[0] + shares[1] + shares[2], 1.0, 1e-12);
}

// No share falls below half an equal one or rises above one and a half (a thread whose share
// vanished would never be measured again), and a thread that reported no time changes nothing.
TEST(WorkBalance, SharesStayWithinBoundsAndNeedEveryThreadsTime) {
  std::vector<double> shares = {0.5, 0.5};
  for (int i = 0; i < 40; ++i)
    shares = rebalancedShares(shares, {shares[0] * 10, shares[1]}); // thread 0 ten times slower
  EXPECT_NEAR(shares[0], 0.25, 1e-9);
  EXPECT_NEAR(shares[1], 0.75, 1e-9);
  EXPECT_EQ(rebalancedShares({0.4, 0.6}, {0, 50}), (std::vector<double>{0.4, 0.6}));
  EXPECT_EQ(rebalancedShares({1.0}, {50}), (std::vector<double>{1.0}));
}

// A team whose thread 1 takes longer over its share than thread 0 gives thread 0 the larger
// share; the blocks each thread starts at split [0, total) without gap or overlap.
TEST(WorkBalance, ABarrierGivesTheFasterThreadMoreOfTheWork) {
  ThreadTeam team(2);
  Barrier& barrier = team.barrier();
  ASSERT_TRUE(barrier.balance().adaptive()) << "RNNC_THREAD_SHARES is set";
  team.run([&](int thread) {
    for (int interval = 0; interval < 300; ++interval) {
      rnnc_share_clock(&barrier, thread, 0);
      if (thread == 1) { // some 100 us of work where thread 0 has almost none
        auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
        while (std::chrono::steady_clock::now() < until) {
        }
      }
      rnnc_share_clock(&barrier, thread, 1);
      rnnc_barrier(&barrier);
    }
  });
  const std::vector<double> shares = barrier.balance().shares();
  EXPECT_GT(shares[0], 0.6);
  EXPECT_NEAR(shares[0] + shares[1], 1.0, 1e-12);
  for (int64_t total : {1, 7, 128}) {
    EXPECT_EQ(barrier.balance().start(0, total), 0);
    EXPECT_LE(barrier.balance().start(1, total), total);
    EXPECT_EQ(barrier.balance().start(2, total), total);
  }
  EXPECT_GT(barrier.balance().start(1, 128), 64);
  // The generated code's entry points: with no team (one thread), all of it on thread 0.
  EXPECT_EQ(rnnc_share_start(nullptr, 0, 9), 0);
  EXPECT_EQ(rnnc_share_start(nullptr, 1, 9), 9);
  EXPECT_EQ(rnnc_share_start(&barrier, 1, 128), barrier.balance().start(1, 128));
}

} // namespace

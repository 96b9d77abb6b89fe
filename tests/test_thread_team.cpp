// The thread teams and barrier the generated code runs on: every thread sees every other
// thread's writes from before a barrier, rounds never mix, and oversubscribed teams (more
// threads than this machine's cores, so waiters must sleep) finish.
#include "runtime/ThreadTeam.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

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

} // namespace

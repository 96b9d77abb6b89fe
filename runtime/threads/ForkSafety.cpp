#include "runtime/threads/ForkSafety.h"

#include "ir/Error.h"

#include <array>
#include <atomic>

#include <pthread.h>

namespace rnnc {
namespace {

struct Held {
  std::mutex* mutex;
  void (*inChild)();
};

// A fixed table (nothing allocated in the fork handlers), filled as each process-wide object is
// first used. The handlers take no lock of the table's own: a registration runs in an object's
// first use, which may come with another of these mutexes held (the target memo's, say), and a
// fork waiting for that mutex while holding the table's would never end. So entries are
// published by a count, each one written before the count covers it.
struct ForkHolds {
  std::mutex registering; // between registrations only
  std::array<Held, 8> held{};
  std::atomic<size_t> published{0};
  // What the last beforeFork locked: the ones to release after it.
  std::atomic<size_t> lockedForFork{0};
};

ForkHolds& forkHolds() {
  static auto* holds = new ForkHolds; // never destroyed: a fork may come during exit
  return *holds;
}

void beforeFork() {
  ForkHolds& holds = forkHolds();
  const size_t count = holds.published.load(std::memory_order_acquire);
  for (size_t i = 0; i < count; ++i)
    holds.held[i].mutex->lock();
  holds.lockedForFork.store(count, std::memory_order_relaxed);
}

void inParent() {
  ForkHolds& holds = forkHolds();
  for (size_t i = holds.lockedForFork.load(std::memory_order_relaxed); i-- > 0;)
    holds.held[i].mutex->unlock();
}

void inChild() {
  ForkHolds& holds = forkHolds();
  for (size_t i = holds.lockedForFork.load(std::memory_order_relaxed); i-- > 0;) {
    if (holds.held[i].inChild)
      holds.held[i].inChild();
    holds.held[i].mutex->unlock(); // locked by this very thread in beforeFork
  }
}

} // namespace

HeldAcrossFork::HeldAcrossFork(std::mutex& mutex, void (*inChildOfFork)()) {
  static const bool handlersInstalled = pthread_atfork(&beforeFork, &inParent, &inChild) == 0;
  RNNC_INTERNAL_CHECK(handlersInstalled, "pthread_atfork failed");
  ForkHolds& holds = forkHolds();
  std::lock_guard<std::mutex> lock(holds.registering);
  const size_t at = holds.published.load(std::memory_order_relaxed);
  RNNC_INTERNAL_CHECK(at < holds.held.size(), "too many mutexes held across fork()");
  holds.held[at] = {&mutex, inChildOfFork};
  holds.published.store(at + 1, std::memory_order_release);
}

} // namespace rnnc

#include "runtime/threads/ThreadTeam.h"

#include "ir/Environment.h"
#include "ir/Error.h"
#include "runtime/threads/ForkSafety.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace rnnc {
namespace {

// Spins before a waiter sleeps: longer than a step's imbalance between threads on dedicated
// cores, shorter than a scheduler time slice. A pause takes tens to ~140 cycles by the core
// (20000 of them: 0.37-0.45 ms on a Zen 5 VM), so this is a few hundred microseconds, not the
// tens it would be with the pause of older cores.
constexpr int kSpins = 20000;
// While it spins, a waiter yields its core every so many pauses (about 5 us) where a thread it
// may be waiting for was last seen on that very core. A team started while another process kept
// one of 2 cores busy had both its threads on the other core; each waiter spun its whole 0.4 ms
// before it let the other run, once a step, and a batch-1 LSTM's first run took 42 ms instead of
// 1 (Zen 5 VM, Linux 6.18). A yield with a teammate elsewhere would instead hand the core to
// whatever else runs there, for its whole time slice (that run took 30 ms).
constexpr int kSpinsBetweenYields = 256;

// Which team thread this is (0: the caller's), for the barrier's record of where each runs.
thread_local int teamThread = 0;

inline void pause() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Waits until `word` differs from `seen`: spins (yielding now and then where `shouldYield()`
// says so), then sleeps. The time past the first kSpinsBetweenYields pauses is added to
// `sleptNs` if given: a wait that long is most likely one for a thread without a core (clock
// reads only on that slow path).
template <class T, class ShouldYield>
void awaitChange(const std::atomic<T>& word, T seen, ShouldYield shouldYield,
                 std::atomic<int64_t>* sleptNs = nullptr) {
  for (int i = 0; i < kSpinsBetweenYields; ++i) {
    if (word.load(std::memory_order_acquire) != seen)
      return;
    pause();
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = kSpinsBetweenYields; i < kSpins; ++i) {
    if (word.load(std::memory_order_acquire) != seen)
      break;
    if (i % kSpinsBetweenYields == 0 && shouldYield())
      sched_yield();
    else
      pause();
  }
  while (word.load(std::memory_order_acquire) == seen)
    word.wait(seen, std::memory_order_acquire);
  if (sleptNs)
    sleptNs->fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count(),
                       std::memory_order_relaxed);
}

} // namespace

Barrier::Barrier(int threads)
    : threads_(threads), balance_(threads),
      cpus_(std::make_unique<std::atomic<int>[]>(static_cast<size_t>(threads))),
      tids_(std::make_unique<std::atomic<int>[]>(static_cast<size_t>(threads))) {
  for (int t = 0; t < threads; ++t) {
    cpus_[t].store(-1, std::memory_order_relaxed);
    tids_[t].store(0, std::memory_order_relaxed);
  }
}

void Barrier::recordCpu() {
  if (teamThread < threads_) // a thread of this team (every caller of it is)
    cpus_[teamThread].store(sched_getcpu(), std::memory_order_relaxed);
}

bool Barrier::teammateOnMyCpu() const {
  const int mine = sched_getcpu();
  for (int t = 0; t < threads_; ++t)
    if (t != teamThread && cpus_[t].load(std::memory_order_relaxed) == mine)
      return true;
  return false;
}

void Barrier::recordThread() {
  // Once per thread, not a system call per run.
  static thread_local const int myTid = static_cast<int>(gettid());
  if (teamThread < threads_)
    tids_[teamThread].store(myTid, std::memory_order_relaxed);
  recordCpu();
}

namespace {

// The core a thread of this process runs on, or last ran on if it waits (field 39 of
// /proc/self/task/TID/stat, after the name in parentheses, which may hold spaces); -1 if unread.
int currentCpuOf(int tid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  char text[1024];
  const ssize_t length = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (length <= 0)
    return -1;
  text[length] = '\0';
  const char* field = std::strrchr(text, ')');
  // Fields 3 onwards follow the name, one space before each: field 39 is the 37th.
  for (int n = 0; field && n < 37; ++n)
    field = std::strchr(field + 1, ' ');
  return field ? std::atoi(field + 1) : -1;
}

} // namespace

void Barrier::refreshTeammatesCpus() {
  for (int t = 0; t < threads_; ++t) {
    const int tid = tids_[t].load(std::memory_order_relaxed);
    if (t == teamThread || tid <= 0)
      continue;
    const int cpu = currentCpuOf(tid);
    if (cpu >= 0)
      cpus_[t].store(cpu, std::memory_order_relaxed);
  }
}

bool Barrier::moveOffTeammatesCpus() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) // more CPUs than a cpu_set_t holds
    return false;
  cpu_set_t elsewhere = allowed;
  const int mine = sched_getcpu();
  if (mine >= 0 && mine < CPU_SETSIZE)
    CPU_CLR(mine, &elsewhere);
  for (int t = 0; t < threads_; ++t) {
    const int cpu = cpus_[t].load(std::memory_order_relaxed);
    if (t != teamThread && cpu >= 0 && cpu < CPU_SETSIZE)
      CPU_CLR(cpu, &elsewhere);
  }
  // A mask without the current core moves the thread at once; the old mask, set again, lets it
  // stay where it went (and go wherever the scheduler sends it later).
  if (CPU_COUNT(&elsewhere) == 0 || sched_setaffinity(0, sizeof(elsewhere), &elsewhere) != 0)
    return false;
  sched_setaffinity(0, sizeof(allowed), &allowed);
  recordCpu();
  moves_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Barrier::arriveAndWait() {
  if (threads_ == 1)
    return;
  uint32_t generation = generation_.load(std::memory_order_acquire);
  recordCpu();
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == threads_) {
    balance_.allArrived(); // alone: the others wait for the generation to change
    arrived_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
    return;
  }
  awaitChange(
      generation_, generation, [this] { return teammateOnMyCpu(); }, &sleptNs_);
}

std::chrono::nanoseconds Barrier::takeSlept() {
  return std::chrono::nanoseconds(sleptNs_.exchange(0, std::memory_order_relaxed));
}

ThreadTeam::ThreadTeam(int threads, std::chrono::nanoseconds moveBelowRound)
    : size_(threads), moveBelowRoundNs_(moveBelowRound.count()), barrier_(threads) {
  try {
    workers_.reserve(static_cast<size_t>(std::max(threads - 1, 0)));
    for (int thread = 1; thread < threads; ++thread)
      workers_.emplace_back([this, thread] { work(thread); });
  } catch (const std::exception& e) { // std::system_error, std::bad_alloc
    const size_t started = workers_.size();
    stopWorkers(); // a destructor does not run for a constructor that throws
    throw UserError("cannot start " + std::to_string(threads) + " threads (the system refused " +
                    "after " + std::to_string(started + 1) + ": " + e.what() +
                    "); ask for fewer (--threads, LayerSpec::threads)");
  }
}

ThreadTeam::~ThreadTeam() {
  stopWorkers();
}

void ThreadTeam::stopWorkers() {
  stopping_.store(true, std::memory_order_release);
  started_.fetch_add(1, std::memory_order_acq_rel);
  started_.notify_all();
  for (std::thread& worker : workers_)
    worker.join();
  workers_.clear();
}

void ThreadTeam::work(int thread) {
  teamThread = thread;
  barrier_.recordThread();
  uint32_t seen = 0;
  for (;;) {
    // Between runs: nothing to yield to (the caller is not waiting for this thread).
    awaitChange(started_, seen, [] { return false; });
    seen = started_.load(std::memory_order_acquire);
    if (stopping_.load(std::memory_order_acquire))
      return;
    // Woken for a run, a worker may find itself on its caller's core (Linux places a wakee
    // beside its waker), and two threads that take turns on one core stay there: the load
    // balancer leaves a thread that ran within the last half millisecond where it is, and a
    // batch-1 step is a few microseconds. A 2-thread batch-1 LSTM (T=100, I=H=256) on a
    // 2-core Zen 5 VM ran 2.6-3.6 ms a run that way in most processes, against 0.55-0.72 (the
    // other core idle; `perf record -e sched:sched_switch`: ~320 turns of each thread on one
    // CPU a run). So the worker moves to another core it may run on, judging where its
    // teammates are from /proc, not from their notes: the caller may have been moved since it
    // noted its core, and moving onto the core it went to would put the two together again.
    // Only for teams whose rounds are short (or that have not run yet): a batch-64 step's
    // pair is parted by the balancer in a moment, and moves there (at every barrier that saw
    // a teammate on the waiter's core, or by the notes alone) ran slower in some processes;
    // this way batch 64 measured the same as without moves (12 alternating processes).
    barrier_.recordCpu();
    if (lastRoundNs_.load(std::memory_order_relaxed) < moveBelowRoundNs_ &&
        barrier_.teammateOnMyCpu()) {
      barrier_.refreshTeammatesCpus();
      if (barrier_.teammateOnMyCpu())
        barrier_.moveOffTeammatesCpus();
    }
    (*job_)(thread);
    if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == size_ - 1)
      finished_.notify_one();
  }
}

void ThreadTeam::run(const std::function<void(int)>& job) {
  if (size_ == 1)
    return job(0);
  job_ = &job;
  teamThread = 0;
  barrier_.recordThread(); // the caller may be another thread than last time
  finished_.store(0, std::memory_order_relaxed);
  started_.fetch_add(1, std::memory_order_acq_rel);
  started_.notify_all();
  const auto start = std::chrono::steady_clock::now();
  const uint32_t firstGeneration = barrier_.generation();
  job(0);
  for (int done = finished_.load(std::memory_order_acquire); done != size_ - 1;
       done = finished_.load(std::memory_order_acquire))
    awaitChange(finished_, done, [this] { return barrier_.teammateOnMyCpu(); });
  const int64_t runNs =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  const uint32_t rounds = barrier_.generation() - firstGeneration;
  lastRoundNs_.store(runNs / (int64_t{rounds} + 1), std::memory_order_relaxed);
  job_ = nullptr;
}

TeamPool& TeamPool::shared() {
  static TeamPool pool;
  static const HeldAcrossFork forkHold(pool.mutex_, &forgetParentsTeams);
  return pool;
}

void TeamPool::forgetParentsTeams() {
  TeamPool& pool = shared();
  // Their objects are left as they are, never destroyed: destroying one would join threads this
  // process does not have. (A team leased at the fork was leased by another thread of the
  // parent's, whose call the child does not continue: it never comes back to this pool.)
  for (std::unique_ptr<ThreadTeam>& team : pool.idle_)
    (void)team.release();
  pool.idle_.clear();
}

bool TeamPool::hasIdle(int threads) {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(idle_.begin(), idle_.end(),
                     [&](const auto& team) { return team->size() == threads; });
}

TeamPool::Lease TeamPool::acquire(int threads) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = idle_.begin(); it != idle_.end(); ++it)
      if ((*it)->size() == threads) {
        std::unique_ptr<ThreadTeam> team = std::move(*it);
        idle_.erase(it);
        return Lease(this, std::move(team));
      }
  }
  return Lease(this, std::make_unique<ThreadTeam>(threads));
}

TeamPool::Lease::~Lease() {
  if (!team)
    return;
  std::lock_guard<std::mutex> lock(pool->mutex_);
  pool->idle_.push_back(std::move(team));
}

int defaultThreadCount() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int maxThreadCount() {
  // Asked once: hardware_concurrency() reads the system's CPU list, several microseconds that a
  // batch-1 step would pay on every call.
  static const int fromHardware =
      std::max(8, 4 * static_cast<int>(std::thread::hardware_concurrency()));
  return static_cast<int>(environmentLimit(
      "RNNC_MAX_THREADS", fromHardware, "a thread count (a positive integer)", int64_t{1} << 20));
}

void checkThreadCount(int threads) {
  if (threads < 0)
    throw UserError("the thread count must be 0 (automatic) or positive, not " +
                    std::to_string(threads));
  const int most = maxThreadCount();
  if (threads > most)
    throw UserError("a run on " + std::to_string(threads) + " threads: at most " +
                    std::to_string(most) + " are allowed (4 per hardware thread; set " +
                    "RNNC_MAX_THREADS to allow more)");
}

} // namespace rnnc

extern "C" void rnnc_barrier(void* team) {
  static_cast<rnnc::Barrier*>(team)->arriveAndWait();
}

extern "C" int64_t rnnc_share_start(void* team, int64_t thread, int64_t total) {
  if (!team)
    return thread <= 0 ? 0 : total;
  return static_cast<const rnnc::Barrier*>(team)->balance().start(static_cast<int>(thread), total);
}

extern "C" void rnnc_share_clock(void* team, int64_t thread, int64_t stop) {
  if (!team)
    return;
  rnnc::WorkBalance& balance = static_cast<rnnc::Barrier*>(team)->balance();
  if (stop)
    balance.workStopped(static_cast<int>(thread));
  else
    balance.workStarted(static_cast<int>(thread));
}

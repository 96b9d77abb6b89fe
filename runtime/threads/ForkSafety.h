// What keeps a child of fork() from waiting forever on rnnc's process-wide state. fork() copies
// only the thread that calls it: a mutex that another thread of the parent held at that moment
// stays locked in the child with nobody to release it, and threads the parent started (a thread
// team's workers) are not there at all. Processes that fork after running rnnc are common: a
// PyTorch DataLoader's workers, a multiprocessing pool, a server's pre-forked workers.
#pragma once

#include <mutex>

namespace rnnc {

// Holds `mutex` across every later fork() from its construction on: the forking thread locks it
// first (so that no other thread is inside it while the process is copied), then releases it in
// the parent, and in the child runs `inChild` (if any; under the lock) and releases it there too.
// Declared beside a process-wide object (a function-local static, or a member after the mutex).
// Only for mutexes held briefly and never while waiting for another of them (the forking thread
// takes them one after another, in the order they were registered). `mutex` must live for the
// rest of the process.
class HeldAcrossFork {
public:
  explicit HeldAcrossFork(std::mutex& mutex, void (*inChild)() = nullptr);
};

} // namespace rnnc

// A child of fork() runs layers as its parent does. fork() copies only the calling thread: the
// thread teams that a multi-threaded run leaves idle in the pool have no threads in the child,
// and a child's first run on several threads used to wait at its first barrier forever (a
// DataLoader's workers, a multiprocessing pool, any process that forks after running rnnc).
// Not under ThreadSanitizer (tests/CMakeLists.txt): it ends a child of a multi-threaded process
// that starts threads.
#include "rnnc/rnnc.h"
#include "runtime/data/Npy.h"

#include "tests/TestSupport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {

// A PyTorch fixture's layer on two threads, and the outputs PyTorch gave.
struct FixtureLayer {
  explicit FixtureLayer(const std::string& cell, const std::string& fixture)
      : dir(rnnc::test::kLayerFixtures + fixture + "/"), layer(build(cell, dir)),
        input(rnnc::readNpyFloat32(dir + "input.npy")), h0(rnnc::readNpyFloat32(dir + "h0.npy")),
        c0(cell == "lstm" ? rnnc::readNpyFloat32(dir + "c0.npy") : rnnc::Tensor()),
        expected(rnnc::readNpyFloat32(dir + "output.npy")) {}

  static rnnc::Layer build(const std::string& cell, const std::string& dir) {
    rnnc::LayerSpec spec;
    spec.cell = cell;
    spec.threads = 2; // a team, even for these small sizes: an explicit count is used as given
    return rnnc::Layer::fromFile(spec, dir + "weights.safetensors");
  }

  // The largest difference from PyTorch's outputs.
  double forwardError() {
    const int64_t steps = input.dim(0), batch = input.dim(1);
    std::vector<float> y(static_cast<size_t>(steps * batch * layer.outputSize()));
    layer.forward(input.data(), steps, batch, h0.data(), c0.rank() ? c0.data() : nullptr, nullptr,
                  y.data(), nullptr, nullptr);
    double worst = 0;
    for (size_t i = 0; i < y.size(); ++i)
      worst = rnnc::test::worseOf(worst, std::abs(double(y[i]) - double(expected.data()[i])));
    return worst;
  }

  std::string dir;
  rnnc::Layer layer;
  rnnc::Tensor input, h0, c0, expected;
};

constexpr double kTolerance = 1e-5;

// Runs `body` in a child process and says how it ended: "passed" (it returned true), "failed",
// "hung" (an alarm ends a child still running after 60 s) or the signal that ended it.
std::string inChild(const std::function<bool()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0)
    return "not started (fork failed)";
  if (pid == 0) {
    alarm(60);
    bool passed = false;
    try {
      passed = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    _exit(passed ? 0 : 1);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid)
    return "lost (waitpid failed)";
  if (WIFEXITED(status))
    return WEXITSTATUS(status) == 0 ? "passed" : "failed";
  if (WIFSIGNALED(status))
    return WTERMSIG(status) == SIGALRM ? "hung"
                                       : "ended by signal " + std::to_string(WTERMSIG(status));
  return "ended oddly";
}

TEST(Fork, AChildRunsTheParentsLayersAndNewOnesOnThreads) {
  FixtureLayer lstm("lstm", "lstm_l1_uni");
  ASSERT_LT(lstm.forwardError(), kTolerance); // leaves a 2-thread team idle in the pool
  EXPECT_EQ(inChild([&] {
              FixtureLayer gru("gru", "gru_l2_uni"); // built in the child
              return lstm.forwardError() < kTolerance && gru.forwardError() < kTolerance &&
                     lstm.forwardError() < kTolerance; // and again, on the child's own team
            }),
            "passed");
  EXPECT_LT(lstm.forwardError(), kTolerance); // the parent's teams are as they were
}

// A fork while another thread of the parent runs layers on threads (it holds a team, and takes
// and gives back buffers and teams): every child still runs.
TEST(Fork, AChildForkedWhileAnotherThreadRunsStillRuns) {
  FixtureLayer busy("lstm", "lstm_l1_uni");
  std::atomic<bool> stop{false};
  std::atomic<int> busyRuns{0}, busyFailures{0};
  std::thread other([&] {
    while (!stop.load()) {
      if (!(busy.forwardError() < kTolerance))
        busyFailures.fetch_add(1);
      busyRuns.fetch_add(1);
    }
  });
  while (busyRuns.load() == 0)
    std::this_thread::yield();
  std::vector<std::string> outcomes;
  for (int child = 0; child < 8; ++child)
    outcomes.push_back(inChild([] {
      FixtureLayer own("rnn_relu", "rnn_relu_l1_uni");
      return own.forwardError() < kTolerance;
    }));
  stop.store(true);
  other.join();
  EXPECT_EQ(outcomes, std::vector<std::string>(8, "passed"));
  EXPECT_EQ(busyFailures.load(), 0);
}

} // namespace

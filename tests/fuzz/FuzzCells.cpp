// The differential cell fuzzer (issue 13): random valid cells, each run by the reference
// interpreter and by the JIT under every pass setting (the default pipeline, each pass disabled
// alone, no premultiply, no fusion), on 1 and 2 threads, for the host's code and, on an AVX-512
// host, the AVX2 code too; every JIT result must match the interpreter's within 1e-5 relative.
//
//   tests/fuzz/cells --count 1000 --seed 7        # or: fuzz_cells in the build tree
//   tests/fuzz/cells --seconds 600 --seed $RANDOM # a timed run with a new seed
//   tests/fuzz/cells --seed 7 --only 412 --print  # one cell again, with its source
//
// Exit status: 0 when every run matched, 1 when any failed (each failure printed with the
// cell's source, sizes and the setting, ready to become a regression test), 2 for bad usage.
#include "frontend/CellParser.h"
#include "ir/Error.h"
#include "passes/PassManager.h"
#include "runtime/exec/Hash.h"
#include "tests/PassSettings.h"
#include "tests/RandomTensors.h"
#include "tests/RunSequence.h"
#include "tests/fuzz/CellGenerator.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <unistd.h>

using namespace rnnc;

namespace {

// The largest difference relative to the reference's magnitude (at least 1).
double relativeError(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape())
    return INFINITY;
  double worst = 0, scale = 1;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    double e = expected.data()[i], a = actual.data()[i];
    if (std::isnan(e) != std::isnan(a))
      return INFINITY;
    if (!std::isnan(e))
      worst = std::max(worst, std::abs(a - e));
    scale = std::max(scale, std::abs(e));
  }
  return worst / scale;
}

// SplitMix64 at position index + 1 of the stream `seed` - 1 (so the fuzzer's seeds name the cells
// they always did): neighbouring seeds and indices give unrelated cells.
uint64_t cellSeed(uint64_t seed, uint64_t index) {
  return splitmix64((seed - 1) * 0x9E3779B97F4A7C15ull + index + 1);
}

struct Options {
  int64_t count = 100;
  uint64_t seed = 1;
  double seconds = 0;
  int64_t only = -1;
  bool print = false;
  int maxFailures = 20;
  std::vector<std::string> targets;
};

class Fuzzer {
public:
  explicit Fuzzer(Options options)
      : options_(std::move(options)), settings_(test::everyPassSetting()) {
    cacheDirectory_ =
        (std::filesystem::temp_directory_path() / fmt::format("rnnc_fuzz_cells_{}", ::getpid()))
            .string();
  }
  ~Fuzzer() {
    std::error_code ignored;
    std::filesystem::remove_all(cacheDirectory_, ignored);
  }

  // Runs one cell every way; returns the number of failed runs.
  int runCell(int64_t index) {
    uint64_t seed = cellSeed(options_.seed, static_cast<uint64_t>(index));
    fuzz::GeneratedCell generated = fuzz::generateCell(seed);
    if (options_.print)
      fmt::print("# cell {} (seed {})\n{}", index, options_.seed, generated.source);
    std::shared_ptr<ir::Cell> cell;
    try {
      cell = frontend::parseCell(generated.source, fmt::format("fuzz_{}.cell", index));
    } catch (const std::exception& e) {
      report(index, generated, "parse (a generator bug: the cell must be valid)", e.what());
      return 1;
    }

    std::mt19937 rng(static_cast<uint32_t>(seed));
    int64_t steps = 1 + static_cast<int64_t>(seed % 5),
            batch = 1 + static_cast<int64_t>(seed / 5 % 5);
    TensorMap weights = test::randomWeights(*cell, generated.sizes, rng);
    SequenceRequest request;
    request.weights = &weights;
    request.sizes = generated.sizes;
    for (const auto& input : cell->inputs)
      request.inputs[input->name] =
          test::randomTensor({steps, batch, *input->shape[1].evaluate(generated.sizes)}, rng, 1.0f);
    for (const auto& state : cell->states)
      request.initialStates[state->name] =
          test::randomTensor({1, batch, *state->shape[1].evaluate(generated.sizes)}, rng, 0.8f);
    request.engine = Engine::Interpreter;
    SequenceResult expected;
    try {
      expected = runSequence(*cell, request);
    } catch (const std::exception& e) {
      report(index, generated, "interpreter (a generator bug: the cell must run)", e.what());
      return 1;
    }

    request.engine = Engine::Jit;
    // Settings that leave the same IR, and the second thread count, reuse the object code.
    request.compile.cache.disk = true;
    request.compile.cache.directory = cacheDirectory_;
    // Now and then a pre-phase buffer of one or two steps' rows: the sequence runs in chunks.
    if (seed % 4 == 0)
      request.compile.sequenceBufferBytes = 1;
    int failures = 0;
    for (const std::string& target : options_.targets)
      for (const test::PassSetting& setting : settings_)
        for (int threads : {1, 2}) {
          std::string where = fmt::format("{}, target {}, {} thread{}, T = {}, B = {}",
                                          setting.name, target.empty() ? "host" : target, threads,
                                          threads == 1 ? "" : "s", steps, batch);
          request.compile.pipeline = setting.pipeline;
          request.compile.targetCpu = target;
          request.threads = threads;
          ++runs_;
          try {
            SequenceResult actual = runSequence(*cell, request);
            double error = relativeError(actual.output, expected.output);
            std::string worst = "output";
            for (const auto& [name, state] : expected.finalStates) {
              double e = relativeError(actual.finalStates.at(name), state);
              if (e > error) {
                error = e;
                worst = "final " + name;
              }
            }
            if (!(error <= 1e-5)) {
              report(index, generated, where,
                     fmt::format("{} differs from the interpreter's by {:.3g} (relative)", worst,
                                 error));
              ++failures;
            }
          } catch (const std::exception& e) {
            report(index, generated, where, e.what());
            ++failures;
          }
          if (failures && failures >= 3)
            return failures; // enough to see the pattern; the next cell
        }
    return failures;
  }

  int run() {
    auto start = std::chrono::steady_clock::now();
    int64_t cells = 0;
    int failures = 0;
    for (int64_t i = options_.only >= 0 ? options_.only : 0;; ++i) {
      if (options_.only >= 0 ? cells == 1 : (options_.seconds > 0 ? false : i >= options_.count))
        break;
      if (options_.seconds > 0 &&
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
              options_.seconds)
        break;
      failures += runCell(i);
      ++cells;
      if (failures >= options_.maxFailures) {
        fmt::print("stopping after {} failures\n", failures);
        break;
      }
    }
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("{} cells (seed {}), {} JIT runs against the interpreter, {} failed, {:.0f} s\n",
               cells, options_.seed, runs_, failures, seconds);
    return failures == 0 ? 0 : 1;
  }

private:
  void report(int64_t index, const fuzz::GeneratedCell& cell, const std::string& where,
              const std::string& what) {
    if (reported_ != index) {
      std::vector<std::string> sizes;
      for (const auto& [name, value] : cell.sizes)
        sizes.push_back(fmt::format("{}={}", name, value));
      fmt::print("FAILED cell {} (--seed {} --only {}), sizes {}:\n{}", index, options_.seed, index,
                 fmt::join(sizes, " "), cell.source);
      reported_ = index;
    }
    fmt::print("  {}: {}\n", where, what);
    std::fflush(stdout);
  }

  Options options_;
  std::vector<test::PassSetting> settings_;
  std::string cacheDirectory_; // this run's own compile cache
  int64_t runs_ = 0;
  int64_t reported_ = -1;
};

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"Differential cell fuzzer: random valid cells, the JIT under every pass setting "
               "against the interpreter"};
  Options options;
  app.add_option("--count", options.count, "how many cells (default 100)");
  app.add_option("--seed", options.seed, "the run's seed: the same seed gives the same cells");
  app.add_option("--seconds", options.seconds, "run new cells until this much time has passed");
  app.add_option("--only", options.only, "run only the cell of this index (as a failure names)");
  app.add_flag("--print", options.print, "print each cell's source");
  app.add_option("--max-failures", options.maxFailures, "stop after this many failed runs");
  app.add_option("--target-cpu", options.targets,
                 "generate for these CPUs (LLVM names; \"\" is the host); default: the host, and "
                 "haswell (AVX2) on an AVX-512 host");
  CLI11_PARSE(app, argc, argv);
  if (options.targets.empty()) {
    options.targets.push_back("");
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
      options.targets.push_back("haswell");
  }
  try {
    return Fuzzer(options).run();
  } catch (const std::exception& e) {
    std::cerr << "fuzz_cells: " << e.what() << "\n";
    return 2;
  }
}

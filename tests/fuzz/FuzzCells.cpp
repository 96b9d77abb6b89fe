// The differential cell fuzzer (issue 13): random valid cells, each run by the reference
// interpreter and by the JIT under every pass setting (the default pipeline, each pass disabled
// alone, no premultiply, no fusion), on 1 and 2 threads, for the host's code and, on an AVX-512
// host, the AVX2 code too; every JIT result must match the interpreter's within 1e-5 relative
// (1e-3 where activations are rounded or quantized, or an fp16 weight is computed: see
// tolerance()).
// With --weights-dtype fp16, bf16 or int8 the JIT stores every linear's weights that way and the
// interpreter computes its products alike: on each product's weight rounded (Eigen's rounding), for
// bf16 with the products' inputs rounded too (ExecutionOptions::bf16Products), for int8 quantized
// (ExecutionOptions::int8Products): what a custom cell computes with reduced weights, checked
// against an oracle that is not the generated code. With --device cuda-emulated the runs are
// the GPU's kernels (codegen/GpuEmitter.h) emulated on this CPU, under every pass setting. With
// --backward they are training runs (mixed precision with --weights-dtype bf16 or fp16): every
// gradient (weights, inputs, initial states) of the JIT's against the interpreter's.
//
//   tests/fuzz/cells --count 1000 --seed 7        # or: fuzz_cells in the build tree
//   tests/fuzz/cells --seconds 600 --seed $RANDOM # a timed run with a new seed
//   tests/fuzz/cells --seed 7 --only 412 --print  # one cell again, with its source
//   tests/fuzz/cells --count 200 --weights-dtype bf16
//   tests/fuzz/cells --count 50 --device cuda-emulated  # the GPU's kernels, run on this CPU
//   tests/fuzz/cells --count 100 --backward             # gradients
//   tests/fuzz/cells --count 100 --backward --weights-dtype bf16  # mixed-precision gradients
//
// Exit status: 0 when every run matched, 1 when any failed (each failure printed with the
// cell's source, sizes and the setting, ready to become a regression test), 2 for bad usage.
#include "codegen/WeightType.h"
#include "frontend/CellParser.h"
#include "ir/Error.h"
#include "passes/PassManager.h"
#include "runtime/exec/Hash.h"
#include "runtime/exec/Interpreter.h"
#include "runtime/layers/Gradients.h"
#include "tests/PassSettings.h"
#include "tests/RandomTensors.h"
#include "tests/RunSequence.h"
#include "tests/fuzz/CellGenerator.h"

#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <cstdlib>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
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

// The interpreter on `request`'s sequence with each product's weight rounded to `type` (a
// parameter, or one made of parameters, as the JIT packs it) and, for bf16, the products' inputs
// rounded as vdpbf16ps takes them: the reference for reduced weights.
SequenceResult interpretReduced(const ir::Cell& cell, const SequenceRequest& request,
                                codegen::WeightType type) {
  std::shared_ptr<ir::Cell> bound = cell.clone();
  bound->bindSizes(request.sizes);
  const TensorMap& weights = *request.weights;
  std::vector<Tensor> params, inputs, states;
  for (const auto& p : bound->params)
    params.push_back(weights.at(p->name));
  for (const auto& input : bound->inputs)
    inputs.push_back(request.inputs.at(input->name));
  for (const auto& state : bound->states) {
    const Tensor& initial = request.initialStates.at(state->name); // [1, B, F]
    states.push_back(initial.reshaped({initial.dim(1), initial.dim(2)}));
  }
  SequenceResult result;
  result.output = Interpreter(*bound, std::move(params), withProductsAs(type)).run(inputs, states);
  for (size_t k = 0; k < states.size(); ++k)
    result.finalStates[bound->states[k]->name] =
        states[k].reshaped({1, states[k].dim(0), states[k].dim(1)});
  return result;
}

struct Options {
  int64_t count = 100;
  uint64_t seed = 1;
  double seconds = 0;
  int64_t only = -1;
  bool print = false;
  int maxFailures = 20;
  std::vector<std::string> targets;
  codegen::WeightType weights = codegen::WeightType::F32;
  Engine engine = Engine::Jit; // or the GPU kernels emulated on this CPU
  bool backward = false;       // gradients instead of the forward's outputs
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
    if (options_.backward)
      return runGradients(index, generated, *cell, request, rng);
    // Every other fp32 cell on the CPU in training: its dropouts draw masks, which the JIT must
    // draw as the interpreter does, whatever the passes hoist, the chunks and the threads.
    request.options.training = options_.weights == codegen::WeightType::F32 &&
                               options_.engine == Engine::Jit && seed % 2 == 1;
    request.options.seed = seed;
    request.engine = Engine::Interpreter;
    SequenceResult expected;
    try {
      expected = options_.weights == codegen::WeightType::F32
                     ? runSequence(*cell, request)
                     : interpretReduced(*cell, request, options_.weights);
    } catch (const std::exception& e) {
      report(index, generated, "interpreter (a generator bug: the cell must run)", e.what());
      return 1;
    }

    request.engine = options_.engine;
    request.compile.weights = options_.weights;
    // Settings that leave the same IR, and the second thread count, reuse the object code.
    request.compile.cache.disk = true;
    request.compile.cache.directory = cacheDirectory_;
    // Now and then a pre-phase buffer of one or two steps' rows: the sequence runs in chunks.
    if (seed % 4 == 0)
      request.compile.sequenceBufferBytes = 1;
    // The fuzzer's small cells all fit in L2, where fp16 steps take their weights widened at
    // packing (codegen::PackedProduct::widenedFrom): every other cell keeps the fp16 tiles.
    request.compile.widenCachedFp16 = seed % 2 == 0;
    return eachRun(index, generated, "", steps, batch,
                   [&](const test::PassSetting& setting, const std::string& target,
                       int threads) -> std::optional<std::string> {
                     request.compile.pipeline = setting.pipeline;
                     request.compile.targetCpu = target;
                     request.threads = threads;
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
                     if (error <= tolerance(*cell))
                       return std::nullopt;
                     return fmt::format("{} differs from the interpreter's by {:.3g} (relative)",
                                        worst, error);
                   });
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
    fmt::print("{} cells (seed {}, {} weights), {} {} runs against the interpreter{}, {} failed, "
               "{:.0f} s\n",
               cells, options_.seed, codegen::weightTypeName(options_.weights), runs_,
               options_.engine == Engine::Jit ? "JIT" : engineName(options_.engine),
               refused_ ? fmt::format(" ({} refused: no linear left)", refused_) : "", failures,
               seconds);
    return failures == 0 ? 0 : 1;
  }

private:
  // --backward: the training run's gradients (the cell's derived backward, BPTT, the weight
  // gradients' products) by the JIT against the interpreter's, for loss = sum(Y * DY) + the final
  // states times random gradients, under every pass setting, target and thread count.
  int runGradients(int64_t index, const fuzz::GeneratedCell& generated, const ir::Cell& cell,
                   const SequenceRequest& sequence, std::mt19937& rng) {
    GradientRequest request;
    request.weights = sequence.weights;
    request.input = sequence.inputs.at(cell.inputs[0]->name);
    request.sideInputs = sequence.inputs;
    request.sideInputs.erase(cell.inputs[0]->name);
    request.initialStates = sequence.initialStates;
    const int64_t steps = request.input.dim(0), batch = request.input.dim(1);
    LayerOptions options;
    options.numLayers = 1;
    // Training: dropout inside the cell draws masks, which the backward reads as kept.
    options.training = true;
    options.seed = static_cast<uint64_t>(index);
    options.sizes = generated.sizes;
    options.engine = Engine::Interpreter;
    // Mixed precision: the interpreter computes its products as the JIT does.
    options.compile.weights = options_.weights;
    // Random gradients of the output and of every final state, shaped as they are.
    request.gradOutput = test::randomTensor(
        {steps, batch, *cell.output->shape[1].evaluate(generated.sizes)}, rng, 1.0f);
    for (const auto& [name, initial] : request.initialStates)
      request.gradFinalStates[name] = test::randomTensor(initial.shape(), rng, 1.0f);
    GradientResult expected;
    try {
      expected = rnnc::runGradients(cell, request, options);
    } catch (const std::exception& e) {
      if (options_.weights != codegen::WeightType::F32 &&
          std::string_view(e.what()).find("would change nothing") != std::string_view::npos) {
        ++refused_; // no product with weights: nothing to reduce, a clear error
        return 0;
      }
      report(index, generated, "interpreter's gradients (the cell must train)", e.what());
      return 1;
    }
    options.engine = Engine::Jit;
    options.compile.cache.disk = true;
    options.compile.cache.directory = cacheDirectory_;
    return eachRun(index, generated, "gradients, ", steps, batch,
                   [&](const test::PassSetting& setting, const std::string& target,
                       int threads) -> std::optional<std::string> {
                     options.compile.pipeline = setting.pipeline;
                     options.compile.targetCpu = target;
                     options.threads = threads;
                     const GradientResult actual = rnnc::runGradients(cell, request, options);
                     double error = 0;
                     std::string worst;
                     for (const auto& [name, gradient] : expected.gradients) {
                       auto it = actual.gradients.find(name);
                       const double e = it == actual.gradients.end()
                                            ? INFINITY
                                            : relativeError(it->second, gradient);
                       if (!(e <= error)) {
                         error = e;
                         worst = name;
                       }
                     }
                     if (error <= gradientTolerance(cell))
                       return std::nullopt;
                     return fmt::format(
                         "the gradient of {} differs from the interpreter's by {:.3g} (relative)",
                         worst, error);
                   });
  }

  // Runs `attempt` under every pass setting, on every target and thread count (the GPU's
  // kernels, the same whatever CPU emulates them on however many threads: under every setting
  // once); `attempt` returns what differs from the interpreter, or nothing. Returns the failed
  // runs, stopping at 3: enough to see the pattern, then the next cell.
  int eachRun(int64_t index, const fuzz::GeneratedCell& generated, const std::string& what,
              int64_t steps, int64_t batch,
              const std::function<std::optional<std::string>(const test::PassSetting&,
                                                             const std::string&, int)>& attempt) {
    const bool onGpu = options_.engine != Engine::Jit;
    const std::vector<std::string> targets =
        onGpu ? std::vector<std::string>{""} : options_.targets;
    const std::vector<int> threadCounts = onGpu ? std::vector<int>{1} : std::vector<int>{1, 2};
    int failures = 0;
    for (const std::string& target : targets)
      for (const test::PassSetting& setting : settings_)
        for (int threads : threadCounts) {
          const std::string where =
              what + (onGpu ? fmt::format("{}, {}, T = {}, B = {}", setting.name,
                                          engineName(options_.engine), steps, batch)
                            : fmt::format("{}, target {}, {} thread{}, T = {}, B = {}",
                                          setting.name, target.empty() ? "host" : target, threads,
                                          threads == 1 ? "" : "s", steps, batch));
          try {
            std::optional<std::string> differs = attempt(setting, target, threads);
            ++runs_;
            if (differs) {
              report(index, generated, where, *differs);
              ++failures;
            }
          } catch (const std::exception& e) {
            // Reduced weights are refused where no linear is left to store them (its result
            // unused): a clear error, as it should be, and nothing to compare.
            if (options_.weights != codegen::WeightType::F32 &&
                std::string_view(e.what()).find("would change nothing") != std::string_view::npos) {
              ++refused_;
              continue;
            }
            ++runs_;
            report(index, generated, where, e.what());
            ++failures;
          }
          if (failures >= 3)
            return failures;
        }
    return failures;
  }

  // Gradients sum over every step and row (the weights') and run back through the steps: more
  // roundings apart than the forward's values; with reduced weights, the forward's tolerance
  // (mixed precision in bf16 on 121 random cells, seed 4841: none apart by 1e-4).
  double gradientTolerance(const ir::Cell& cell) const { return std::max(1e-4, tolerance(cell)); }

  // How far the JIT may be from the interpreter, relative to the output's magnitude (at least
  // 1). Where activations are rounded before a product (bf16) or quantized (int8), a value within
  // a last-place difference of a rounding boundary (the two engines' elementwise functions differ
  // in the last bit) goes to the neighbouring step in one engine: an output then moves by some
  // 1e-4 (random cells with bf16 weights at 1e-5: 2 such cells in 58). fp16 rounds only the
  // weights, alike in both engines where each is a parameter; a weight made of parameters
  // through tanh or sigmoid (CellGenerator.h) can land on either side of an fp16 boundary, one
  // weight an fp16 step (2^-11 of it) apart: 1.2e-5 after a layer norm (seed 4006, cell 95).
  double tolerance(const ir::Cell& cell) const {
    if (options_.weights == codegen::WeightType::BF16 ||
        options_.weights == codegen::WeightType::I8)
      return 1e-3;
    if (options_.weights == codegen::WeightType::F16 && hasComputedWeight(cell))
      return 1e-3;
    return 1e-5;
  }

  // Whether a product's weight is computed rather than a parameter itself.
  static bool hasComputedWeight(const ir::Cell& cell) {
    for (const ir::Block* block : {&cell.pre, &cell.step})
      for (const auto& instr : *block)
        if (ir::isMatrixProduct(instr->op) && !(instr->operands[1]->isArgument() &&
                                                instr->operands[1]->argKind == ir::ArgKind::Param))
          return true;
    return false;
  }

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
  int64_t refused_ = 0; // runs of reduced weights refused: the cell's linears were all dead
  int64_t reported_ = -1;
};

} // namespace

int main(int argc, char** argv) {
  // A pass that breaks a random cell's IR is named (release builds verify only the pipeline's
  // result unless asked: passes/PassManager.cpp).
  setenv("RNNC_VERIFY_EACH_PASS", "1", 0);
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
  std::string weights = "fp32";
  app.add_option("--weights-dtype", weights,
                 "how the JIT stores the linears' weights: fp32 (default), fp16, bf16 or int8, "
                 "the interpreter computing its products alike")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16", "int8"}));
  std::string device = "cpu";
  app.add_option("--device", device,
                 "cpu (default: the JIT) or cuda-emulated (the GPU's kernels, run on this CPU "
                 "thread after thread: the PTX path's code, checked without a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda-emulated"}));
  app.add_flag("--backward", options.backward,
               "the gradients of a training run (JIT against the interpreter) instead of the "
               "forward's outputs");
  CLI11_PARSE(app, argc, argv);
  options.weights = codegen::parseWeightType(weights);
  options.engine = engineFor(device, /*interpret=*/false, "--device", "--interpret");
  if (options.engine != Engine::Jit && options.weights != codegen::WeightType::F32) {
    std::cerr << "fuzz_cells: the GPU's kernels take fp32 weights only\n";
    return 2;
  }
  if (options.backward &&
      (options.engine != Engine::Jit || options.weights == codegen::WeightType::I8)) {
    std::cerr << "fuzz_cells: --backward trains the CPU JIT with fp32, bf16 or fp16 weights\n";
    return 2;
  }
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

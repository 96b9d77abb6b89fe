// `rnnc bench`: times whole sequences of a cell on random data, at the fastrnns default size
// unless told otherwise, each path's median over --repeat runs in one table (or --json): the
// reference interpreter (the unfused baseline; --jit-only skips it), the JIT with every pass,
// without the premultiply and with the products apart from their kernels, at --threads
// (0: automatic); a batch of variable lengths against the padded one; the cold and cached
// compile times; --backward the training's forward and backward; --device cuda the GPU's kernels,
// per step and persistent, checked against the JIT's outputs; --eltwise the rnn_eltwise workload;
// --target-cpu and --weights-dtype the code for another CPU or reduced weights.
#include "codegen/Target.h"
#include "frontend/BuiltinCells.h"
#include "ir/Error.h"
#include "ir/Verifier.h"
#include "runtime/exec/CompiledCell.h"
#include "runtime/exec/Interpreter.h"
#include "runtime/exec/TargetMemo.h"
#include "runtime/gpu/CudaDriver.h"
#include "runtime/gpu/GpuCell.h"
#include "runtime/layers/Gradients.h"
#include "runtime/layers/LayerRunner.h"
#include "tools/CommandLine.h"
#include "tools/Commands.h"
#include "tools/EltwiseBench.h"
#include "tools/Timing.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <tuple>
#include <unistd.h>

namespace rnnc::tools {
namespace {

struct BenchOptions {
  std::string cell = "lstm";
  int64_t seq = 100, batch = 64, input = 512, hidden = 512;
  int repeat = 5, warmup = 1;
  int threads = 1; // the JIT paths; the interpreter is single-threaded
  bool eltwise = false;
  bool jitOnly = false;  // only the fully optimised JIT: for bench/compare
  bool backward = false; // forward + backward (training) instead of inference
  bool json = false;
  std::string targetCpu; // empty: the host
  std::string weightsDtype = "fp32";
  std::vector<std::string> sizes;
  std::string device = "cpu"; // cuda: the GPU's kernels too
};

Tensor randomTensor(const TensorShape& shape, float bound, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-bound, bound);
  Tensor t(shape);
  for (float& v : t.values())
    v = dist(rng);
  return t;
}

TensorShape concrete(const ir::Shape& shape, const ir::SizeMap& sizes) {
  TensorShape out;
  for (const ir::Dim& d : shape)
    out.push_back(*d.evaluate(sizes));
  return out;
}

struct CompileTimes {
  double cold = 0, cached = 0; // milliseconds
};

// Compile time with every cache off, and from a warm disk cache (a fresh directory, filled once)
// without the in-process cache: what a second process pays.
CompileTimes measureCompileTimes(const ir::Cell& cell, int repeat, const std::string& targetCpu) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("rnnc-bench-cache-" + std::to_string(getpid()));
  CompileOptions cold;
  cold.targetCpu = targetCpu;
  cold.cache.disk = false;
  cold.memoryCache = false;
  CompileOptions cached = cold;
  cached.cache.disk = true;
  cached.cache.directory = dir.string();
  CompiledCell::compile(cell, cached); // fills the cache
  auto median = [&](const CompileOptions& options) {
    std::vector<double> ms;
    for (int i = 0; i < std::max(repeat, 3); ++i)
      ms.push_back(CompiledCell::compile(cell, options)->compileMilliseconds());
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  CompileTimes times{median(cold), median(cached)};
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return times;
}

struct VariableLength {
  Timing padded, withLengths;
  double meanLength = 0;
};

// The same batch through the layer runner twice: every sequence T long (padded), and with
// lengths drawn uniformly from [1, T], which skips the padding.
VariableLength measureVariableLength(const ir::Cell& cell, const std::vector<Tensor>& params,
                                     const std::vector<Tensor>& inputs,
                                     const std::vector<Tensor>& initialStates,
                                     const BenchOptions& o, std::mt19937& rng) {
  TensorMap weights;
  for (size_t i = 0; i < cell.params.size(); ++i)
    weights[cell.params[i]->name] = params[i];
  LayerRequest request;
  request.weights = &weights;
  request.input = inputs.at(0);
  for (size_t i = 0; i < cell.states.size(); ++i)
    request.initialStates[cell.states[i]->name] =
        initialStates[i].reshaped({1, initialStates[i].dim(0), initialStates[i].dim(1)});
  LayerOptions options;
  options.compile.cache.disk = false;
  options.compile.targetCpu = o.targetCpu;
  options.threads = o.threads;
  // Built once, as a user serving many batches would: the timings are of runs alone, not of
  // compiling and packing the weights.
  auto program = LayerProgram::build(cell, weights, request.weightsSource, options);
  auto run = [&] { program->run(request.input, request.initialStates, request.lengths); };
  VariableLength result;
  result.padded = timeRepeats(o.warmup, o.repeat, run);
  std::uniform_int_distribution<int64_t> length(1, o.seq);
  Int64Array lengths{{o.batch}, {}};
  for (int64_t b = 0; b < o.batch; ++b)
    lengths.values.push_back(length(rng));
  result.meanLength = std::accumulate(lengths.values.begin(), lengths.values.end(), 0.0) / o.batch;
  request.lengths = lengths;
  result.withLengths = timeRepeats(o.warmup, o.repeat, run);
  return result;
}

// Reduced-precision weights against fp32: the errors of one output against the other.
struct WeightsAccuracy {
  double maxAbs = 0, meanAbs = 0;
  double maxAbsRelative = 0; // maxAbs over the largest |value| of the fp32 output
  double speedup = 0;        // the fp32 run's median time over the reduced one's
};

WeightsAccuracy compareOutputs(const Tensor& fp32, const Tensor& reduced) {
  RNNC_INTERNAL_CHECK(fp32.shape() == reduced.shape(), "outputs of different shapes");
  WeightsAccuracy a;
  double largest = 0, sum = 0;
  for (int64_t i = 0; i < fp32.numel(); ++i) {
    double error = std::abs(static_cast<double>(fp32.data()[i]) - reduced.data()[i]);
    a.maxAbs = std::max(a.maxAbs, error);
    sum += error;
    largest = std::max(largest, std::abs(static_cast<double>(fp32.data()[i])));
  }
  a.meanAbs = fp32.numel() > 0 ? sum / static_cast<double>(fp32.numel()) : 0;
  a.maxAbsRelative = largest > 0 ? a.maxAbs / largest : a.maxAbs;
  return a;
}

// Mixed-precision training against fp32: each gradient's errors, the worst of them (the
// relative error the worst of each gradient's max abs error over its own largest |value|).
WeightsAccuracy compareGradients(const TensorMap& fp32, const TensorMap& reduced) {
  RNNC_INTERNAL_CHECK(fp32.size() == reduced.size(), "different gradients");
  WeightsAccuracy worst;
  double sum = 0;
  int64_t count = 0;
  for (const auto& [name, gradient] : fp32) {
    WeightsAccuracy a = compareOutputs(gradient, reduced.at(name));
    worst.maxAbs = std::max(worst.maxAbs, a.maxAbs);
    worst.maxAbsRelative = std::max(worst.maxAbsRelative, a.maxAbsRelative);
    sum += a.meanAbs * static_cast<double>(gradient.numel());
    count += gradient.numel();
  }
  worst.meanAbs = count > 0 ? sum / static_cast<double>(count) : 0;
  return worst;
}

// Multiply-add work of one sequence: 2*M*N*K per matrix product and step, M = B.
double matmulFlops(const ir::Cell& cell, int64_t steps, int64_t batch) {
  return ir::matrixProductFlopsPerStep(cell, batch) * static_cast<double>(steps);
}

// "26.844 GFLOP", "1.229 MFLOP", "640 FLOP": a unit that shows the figure at every size.
std::string flopText(double flop) {
  if (flop >= 1e9)
    return fmt::format("{:.3f} GFLOP", flop * 1e-9);
  if (flop >= 1e6)
    return fmt::format("{:.3f} MFLOP", flop * 1e-6);
  if (flop >= 1e3)
    return fmt::format("{:.3f} kFLOP", flop * 1e-3);
  return fmt::format("{:.0f} FLOP", flop);
}

int bench(const BenchOptions& o) {
  if (o.seq < 1 || o.batch < 1 || o.input < 1 || o.hidden < 1 || o.repeat < 1 || o.warmup < 0)
    throw UserError("--seq, --batch, --input, --hidden and --repeat must be positive, and "
                    "--warmup not negative");
  if (o.eltwise)
    return benchEltwise(o.batch, o.hidden, o.repeat, o.json);
  checkThreadsOption(o.threads);
  // Checked before any work: an unknown CPU, or one whose code this host cannot run.
  const codegen::Target target = runnableTarget(o.targetCpu, CacheOptions::fromEnvironment());
  const codegen::WeightType reduced = codegen::parseWeightType(o.weightsDtype);
  if (reduced == codegen::WeightType::I8 && o.backward)
    throw UserError("--weights-dtype int8 times inference: training takes fp32, bf16 or fp16");
  const bool cuda = o.device == "cuda";
  if (cuda && (o.backward || reduced != codegen::WeightType::F32))
    throw UserError("--device cuda times fp32 inference (training and reduced weights run on the "
                    "CPU)");
  if (cuda)
    CudaDriver::get(); // no GPU: say so before any work
  const bool onlyJit = o.jitOnly || cuda;
  auto cell = frontend::loadCell(o.cell);
  ir::SizeMap sizes = parseSizes(o.sizes);
  for (auto [name, value] : {std::pair<const char*, int64_t>{"input_size", o.input},
                             std::pair<const char*, int64_t>{"hidden_size", o.hidden}})
    if (std::count(cell->sizeNames.begin(), cell->sizeNames.end(), name) && !sizes.count(name))
      sizes[name] = value;
  for (const auto& name : cell->sizeNames)
    if (!sizes.count(name))
      throw UserError("cell '" + cell->name + "' has a size '" + name + "'; give it with --size " +
                      name + "=VALUE");
  cell->bindSizes(sizes);
  ir::verify(*cell);

  std::mt19937 rng(42);
  ir::SizeMap withBatch = cell->sizes;
  withBatch[ir::kBatchSymbol] = o.batch;
  std::vector<Tensor> params;
  for (const auto& param : cell->params)
    params.push_back(randomTensor(concrete(param->shape, withBatch),
                                  1.0f / std::sqrt(static_cast<float>(o.hidden)), rng));
  std::vector<Tensor> inputs;
  for (const auto& input : cell->inputs) {
    TensorShape step = concrete(input->shape, withBatch);
    inputs.push_back(randomTensor({o.seq, step[0], step[1]}, 1.0f, rng));
  }
  std::vector<Tensor> initialStates;
  for (const auto& state : cell->states)
    initialStates.push_back(randomTensor(concrete(state->shape, withBatch), 1.0f, rng));

  // Each path on the same inputs; the fully optimised JIT last in the table.
  struct Path {
    const char* key;  // for --json
    const char* name; // for the table
    Timing timing;
  };
  std::vector<Path> paths;
  // The outputs (gradients, in training) of the last timed run of the fp32 and the
  // reduced-precision JIT, compared below.
  Tensor fp32Output, reducedOutput;
  TensorMap fp32Gradients, reducedGradients;
  bool widenedFp16 = false; // whether the fp16 path's step products are widened at packing
  auto jitTiming = [&](passes::PipelineOptions pipeline,
                       codegen::WeightType weights = codegen::WeightType::F32,
                       Tensor* keptOutput = nullptr, bool widenCachedFp16 = true) {
    CompileOptions options;
    options.pipeline = pipeline;
    options.cache.disk = false;
    options.targetCpu = o.targetCpu;
    options.weights = weights;
    options.widenCachedFp16 = widenCachedFp16;
    auto compiled = CompiledCell::compile(*cell, options);
    if (weights == codegen::WeightType::F16 && widenCachedFp16)
      for (const codegen::PackedProduct& packed : compiled->plan().packedProducts)
        widenedFp16 |= packed.widenedFrom == codegen::WeightType::F16;
    // The parameter-only work (weights packed for the tiles) is done once, as a layer does it
    // when it is built, and as oneDNN reorders its weights: not part of a sequence's time.
    auto prepared = compiled->prepare(params, o.threads);
    Tensor output;
    CompiledCell::Workspace workspace;
    Timing timing = timeRepeats(o.warmup, o.repeat, [&] {
      std::vector<Tensor> states = initialStates;
      compiled->run(*prepared, inputs, states, output, workspace, o.threads);
    });
    if (keptOutput)
      *keptOutput = std::move(output);
    return timing;
  };
  // Training: the forward that keeps the states, then the backward derived from the cell, on
  // random output gradients; every path on the same data.
  int64_t trainingBytes = 0, recomputeBytes = 0;
  // Every path the same random output gradient, so that their gradients compare.
  const Tensor outputGradient =
      o.backward ? randomTensor({o.seq, o.batch, ir::columnsOf(cell->output)}, 1.0f, rng)
                 : Tensor();
  // With `keptGradients`, the gradients of the last timed run are kept there.
  auto trainingTiming = [&](Engine engine, passes::PipelineOptions pipeline,
                            passes::ForwardValues forwardValues, int64_t& bytes,
                            codegen::WeightType weightType = codegen::WeightType::F32,
                            TensorMap* keptGradients = nullptr) {
    TensorMap weights;
    for (size_t i = 0; i < cell->params.size(); ++i)
      weights[cell->params[i]->name] = params[i];
    LayerOptions options;
    options.engine = engine;
    options.threads = o.threads;
    options.training = true; // a cell's dropouts draw their masks, as a training step's do
    options.compile.pipeline = pipeline;
    options.compile.cache.disk = false;
    options.compile.targetCpu = o.targetCpu;
    options.compile.weights = weightType;
    auto program = GradientProgram::build(*cell, weights, "random weights", options, forwardValues);
    std::map<std::string, Tensor> initial;
    for (size_t i = 0; i < cell->states.size(); ++i)
      initial[cell->states[i]->name] =
          initialStates[i].reshaped({1, initialStates[i].dim(0), initialStates[i].dim(1)});
    GradientInputs grads;
    grads.output = outputGradient;
    // Each run hands the forward its input, a copy made before the run's timing, as a training
    // loop hands over each batch it has just made (PyTorch's autograd too keeps the tensor it
    // was given): the tape keeps it without a copy of its own.
    Tensor handed;
    return timeRepeats(
        o.warmup, o.repeat, [&] { handed = inputs[0]; },
        [&] {
          TrainingTape tape = program->forward(std::move(handed), initial, std::nullopt);
          tape.forward.output = Tensor(); // the caller's y, as cuDNN's caller keeps it
          bytes = tape.bytes();
          TensorMap gradients = program->backward(tape, grads);
          if (keptGradients)
            *keptGradients = std::move(gradients);
        });
  };
  if (o.backward) {
    if (cell->inputs.size() != 1)
      throw UserError("--backward times cells with one input");
    using passes::ForwardValues;
    if (!onlyJit) {
      paths.push_back(
          {"train_interpreter", "fwd+bwd, interpreter (unfused)",
           trainingTiming(Engine::Interpreter, {}, ForwardValues::Keep, trainingBytes)});
      passes::PipelineOptions noFuse;
      noFuse.fuse = false;
      paths.push_back({"train_jit_no_fuse", "fwd+bwd, jit, no fusion",
                       trainingTiming(Engine::Jit, noFuse, ForwardValues::Keep, trainingBytes)});
      paths.push_back({"train_jit_recompute", "fwd+bwd, jit, forward recomputed",
                       trainingTiming(Engine::Jit, {}, ForwardValues::Recompute, recomputeBytes)});
    }
    paths.push_back({"train_jit", "fwd+bwd, jit, all passes",
                     trainingTiming(Engine::Jit, {}, ForwardValues::Keep, trainingBytes,
                                    codegen::WeightType::F32, &fp32Gradients)});
  }
  if (!onlyJit && !o.backward) {
    Interpreter interpreter(*cell, params);
    paths.push_back({"interpreter", "interpreter (unfused)", timeRepeats(o.warmup, o.repeat, [&] {
                       std::vector<Tensor> states = initialStates;
                       interpreter.run(inputs, states);
                     })});
    passes::PipelineOptions noPremul;
    noPremul.premultiply = false;
    paths.push_back({"jit_no_premul", "jit, no premultiply", jitTiming(noPremul)});
    passes::PipelineOptions noMatMulFusion;
    noMatMulFusion.disabled.insert("fuse-matmul");
    paths.push_back(
        {"jit_no_fuse_matmul", "jit, product apart + kernel", jitTiming(noMatMulFusion)});
  }
  if (!o.backward)
    paths.push_back(
        {"jit", "jit, all passes", jitTiming({}, codegen::WeightType::F32, &fp32Output)});
  // The GPU's kernels on data already on the GPU (what a cuDNN timing measures): the launches of
  // the pre, step and final regions, per step or as one persistent kernel, and the persistent
  // kernel with its block tiles in fp32 FMAs rather than on the tensor cores; their outputs are
  // checked against the CPU's JIT.
  double gpuError = 0;
  std::string gpuName;
  if (cuda) {
    std::vector<TensorShape> inputShapes, stateShapes;
    for (const Tensor& x : inputs)
      inputShapes.push_back(x.shape());
    for (const Tensor& s : initialStates)
      stateShapes.push_back(s.shape());
    GpuCell::Options options, fmaOptions;
    fmaOptions.tensorCores = false;
    auto gpu = GpuCell::compile(*cell, options), fmaGpu = GpuCell::compile(*cell, fmaOptions);
    gpuName = CudaDriver::get().deviceName() + " (" + gpu->gpu() + ")";
    auto resident = gpu->resident(params, inputShapes, stateShapes);
    auto fmaResident = fmaGpu->resident(params, inputShapes, stateShapes);
    resident->upload(inputs, initialStates);
    fmaResident->upload(inputs, initialStates);
    for (auto [run, schedule, key, name] :
         {std::tuple{resident.get(), GpuSchedule::PerStep, "cuda_per_step",
                     "cuda, a kernel per region+step"},
          std::tuple{resident.get(), GpuSchedule::Persistent, "cuda_persistent",
                     "cuda, persistent kernel"},
          std::tuple{fmaResident.get(), GpuSchedule::Persistent, "cuda_persistent_fp32_fma",
                     "cuda, persistent, no tensor cores"}}) {
      paths.push_back({key, name, timeRepeats(o.warmup, o.repeat, [run = run, schedule = schedule] {
                         run->execute(schedule);
                       })});
      std::vector<Tensor> states = initialStates;
      run->upload(inputs, states);
      run->execute(schedule);
      Tensor output = run->download(states);
      for (int64_t i = 0; i < output.numel(); ++i)
        gpuError = std::max<double>(gpuError, std::abs(output.data()[i] - fp32Output.data()[i]));
    }
  }
  std::optional<WeightsAccuracy> accuracy;
  const std::string reducedName(codegen::weightTypeName(reduced));
  const std::string reducedKey = (o.backward ? "train_jit_" : "jit_") + reducedName,
                    reducedRow =
                        (o.backward ? "fwd+bwd, jit, " : "jit, ") + reducedName + " weights";
  if (reduced != codegen::WeightType::F32 && o.backward) {
    int64_t bytes = 0;
    paths.push_back({reducedKey.c_str(), reducedRow.c_str(),
                     trainingTiming(Engine::Jit, {}, passes::ForwardValues::Keep, bytes, reduced,
                                    &reducedGradients)});
    accuracy = compareGradients(fp32Gradients, reducedGradients);
    accuracy->speedup = paths[paths.size() - 2].timing.median / paths.back().timing.median;
  } else if (reduced != codegen::WeightType::F32) {
    paths.push_back(
        {reducedKey.c_str(), reducedRow.c_str(), jitTiming({}, reduced, &reducedOutput)});
    accuracy = compareOutputs(fp32Output, reducedOutput);
    accuracy->speedup = paths[paths.size() - 2].timing.median / paths.back().timing.median;
    // Where the step's fp32 weights fit in L2 they are widened at packing: the fp16 tiles
    // beside them, for the comparison (the same values, so the same outputs but for the order
    // of the sums).
    if (widenedFp16)
      paths.push_back({"jit_fp16_tiles", "jit, fp16 weights, fp16 tiles",
                       jitTiming({}, reduced, nullptr, /*widenCachedFp16=*/false)});
  }
  std::optional<CompileTimes> compileTimes;
  std::optional<VariableLength> varlen;
  if (!onlyJit && !o.backward) {
    compileTimes = measureCompileTimes(*cell, o.repeat, o.targetCpu);
    varlen = measureVariableLength(*cell, params, inputs, initialStates, o, rng);
  }

  // Training does the products three times: forward, the gradient of their operands, the
  // weights' gradients (the recomputation of the forward, on the path that does it, is not
  // counted).
  double gflop = matmulFlops(*cell, o.seq, o.batch) * 1e-9 * (o.backward ? 3 : 1);
  if (o.json) {
    nlohmann::json out = {{"cell", cell->name},
                          {"T", o.seq},
                          {"B", o.batch},
                          {"sizes", cell->sizes},
                          {"threads", o.threads},
                          {"gflop_per_sequence", gflop},
                          {"repeat", o.repeat},
                          {"target",
                           {{"cpu", target.cpu},
                            {"vector_width", target.vectorWidth},
                            {"vector_registers", target.vectorRegisters},
                            {"l2_bytes", target.l2Bytes}}}};
    for (const Path& path : paths)
      out["paths"][path.key] = {{"median_ms", path.timing.median},
                                {"min_ms", path.timing.min},
                                {"max_ms", path.timing.max},
                                {"mean_ms", path.timing.mean}};
    if (accuracy)
      out["weights_dtype"] = {{"dtype", reducedName},
                              {"compared", o.backward ? "gradients" : "output"},
                              {"max_abs_error", accuracy->maxAbs},
                              {"mean_abs_error", accuracy->meanAbs},
                              {"max_abs_error_relative", accuracy->maxAbsRelative},
                              {"speedup_over_fp32", accuracy->speedup}};
    if (cuda)
      out["cuda"] = {{"device", gpuName}, {"max_abs_error_vs_jit", gpuError}};
    if (o.backward)
      out["training_workspace_bytes"] = trainingBytes;
    if (recomputeBytes > 0)
      out["training_workspace_bytes_recompute"] = recomputeBytes;
    if (compileTimes)
      out["compile_ms"] = {{"cold", compileTimes->cold}, {"disk_cache", compileTimes->cached}};
    if (varlen)
      out["variable_length"] = {{"padded_ms", varlen->padded.median},
                                {"lengths_ms", varlen->withLengths.median},
                                {"mean_length", varlen->meanLength}};
    fmt::print("{}\n", out.dump());
    return 0;
  }
  std::string sizeText;
  for (const auto& [name, value] : cell->sizes)
    sizeText += fmt::format(" {}={}", name, value);
  std::string threadText = o.threads == 0   ? "automatic threads"
                           : o.threads == 1 ? "1 thread"
                                            : fmt::format("{} threads", o.threads);
  fmt::print("rnnc bench: cell {}, T={} B={}{}, JIT for {} ({}-float vectors) on {}, {} repeats "
             "(median, min, max)\n",
             cell->name, o.seq, o.batch, sizeText, target.cpu, target.vectorWidth, threadText,
             o.repeat);
  fmt::print("matrix-product work: {} per sequence\n\n", flopText(gflop * 1e9));
  fmt::print("{:<32}{:>12}{:>10}{:>10}{:>10}{:>9}\n", "path", "median ms", "min ms", "max ms",
             "GFLOP/s", "speedup");
  for (const Path& path : paths) {
    const Timing& t = path.timing;
    fmt::print("{:<32}{:>12.3f}{:>10.3f}{:>10.3f}{:>10.1f}{:>8.2f}x\n", path.name, t.median, t.min,
               t.max, gflop / (t.median * 1e-3), paths.front().timing.median / t.median);
  }
  if (accuracy && o.backward)
    fmt::print("\n{} weights against fp32 (the gradients of the same run, each against its own "
               "largest value): max abs error {:.3g} ({:.3g} of the largest), mean abs error "
               "{:.3g}; {:.2f}x the fp32 speed\n",
               reducedName, accuracy->maxAbs, accuracy->maxAbsRelative, accuracy->meanAbs,
               accuracy->speedup);
  else if (accuracy)
    fmt::print("\n{} weights against fp32 (outputs of the same run): max abs error {:.3g} ({:.3g} "
               "of the largest output), mean abs error {:.3g}; {:.2f}x the fp32 speed\n",
               reducedName, accuracy->maxAbs, accuracy->maxAbsRelative, accuracy->meanAbs,
               accuracy->speedup);
  if (cuda)
    fmt::print("\nGPU: {}; outputs within {:.3g} of the CPU JIT's\n", gpuName, gpuError);
  if (o.backward)
    fmt::print("\ntraining workspace (what the backward reads beyond the input and the output: "
               "the states each step leaves and the values it keeps; an LSTM's c and four gates, "
               "cuDNN's reserve space): {} bytes, {:.3g} floats per step and sequence\n",
               trainingBytes, trainingBytes / (4.0 * o.seq * o.batch));
  if (recomputeBytes > 0)
    fmt::print("with the forward recomputed in the backward (the states only): {} bytes\n",
               recomputeBytes);
  if (varlen)
    fmt::print("\nvariable length (layer runner, JIT): lengths uniform in [1, {}] (mean {:.1f}) "
               "take {:.3f} ms, {:.0f}% of the {:.3f} ms padded run\n",
               o.seq, varlen->meanLength, varlen->withLengths.median,
               100 * varlen->withLengths.median / varlen->padded.median, varlen->padded.median);
  if (compileTimes)
    fmt::print("\ncompile (passes + LLVM + load), median of {}: cold {:.2f} ms, from the disk "
               "cache {:.2f} ms\n",
               o.repeat, compileTimes->cold, compileTimes->cached);
  return 0;
}

} // namespace

CommandAction addBenchCommand(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time whole sequences of a cell (default: the fastrnns LSTM, T=100 B=64 I=H=512)");
  cmd->add_option("--cell", o->cell, "Built-in cell name, .cell file or .rnnir IR dump")
      ->default_val("lstm");
  cmd->add_option("--seq", o->seq, "Sequence length T")->default_val(100);
  cmd->add_option("--batch", o->batch, "Batch size B")->default_val(64);
  cmd->add_option("--input", o->input, "input_size")->default_val(512);
  cmd->add_option("--hidden", o->hidden, "hidden_size")->default_val(512);
  cmd->add_option("--size", o->sizes, "Bind any other named size: NAME=VALUE (repeatable)");
  cmd->add_option("--repeat", o->repeat, "Timed repeats; the median is reported")->default_val(5);
  cmd->add_option("--warmup", o->warmup, "Untimed runs before timing")->default_val(1);
  cmd->add_flag("--eltwise", o->eltwise,
                "Instead: PyTorch's rnn_eltwise step (fused vs unfused, GB/s against a STREAM "
                "triad); uses --batch and --hidden");
  cmd->add_option("--threads", o->threads,
                  "Threads for the JIT paths (each step split between them; the interpreter "
                  "and the single-thread figures of the issue targets use 1); 0: automatic")
      ->default_val(1);
  cmd->add_flag("--jit-only", o->jitOnly,
                "Time only the fully optimised JIT (no interpreter, compile or variable-length "
                "runs)");
  cmd->add_flag("--json", o->json, "Print the results as one JSON object");
  cmd->add_flag("--backward", o->backward,
                "Time training: forward + backward (the derived backward cell and the weight "
                "gradients) in training mode (a cell's dropouts draw masks), fused and unfused "
                "JIT against the interpreter");
  cmd->add_option("--device", o->device,
                  "cuda: also time the GPU's kernels (a kernel launch per region and step, and "
                  "one persistent kernel, also without tensor cores) on data already on the GPU, "
                  "beside the CPU JIT")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->default_val("cpu");
  cmd->add_option("--target-cpu", o->targetCpu,
                  "Generate for this x86-64 CPU by LLVM's name and run it here (haswell: the AVX2 "
                  "code on an AVX-512 host); default: the host");
  cmd->add_option("--weights-dtype", o->weightsDtype,
                  "Also time the JIT with its weights stored as fp16 (widened to fp32 in "
                  "registers), bf16 (bf16 products summed in fp32: AMX tiles where the CPU has "
                  "them, vdpbf16ps on AMD's AVX512_BF16) or "
                  "int8 (dynamic quantization), and report its error against fp32; with "
                  "--backward, mixed-precision training in bf16 or fp16 (the gradients' error)")
      ->default_val("fp32");
  return [o] { return bench(*o); };
}

} // namespace rnnc::tools

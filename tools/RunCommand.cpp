#include "frontend/BuiltinCells.h"
#include "ir/Error.h"
#include "ir/FileIO.h"
#include "runtime/data/Npy.h"
#include "runtime/data/SafeTensors.h"
#include "runtime/data/WeightFile.h"
#include "runtime/data/WeightLayouts.h"
#include "runtime/data/Weights.h"
#include "runtime/layers/Gradients.h"
#include "runtime/layers/LayerRunner.h"
#include "tools/CommandLine.h"
#include "tools/Commands.h"

#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <optional>

namespace rnnc::tools {
namespace {

struct RunOptions {
  std::string cell, weights, output;
  std::vector<std::string> inputs, states, finals, sizes;
  std::string h0, c0, hn, cn;
  bool train = false, interpret = false, bidirectional = false, batchFirst = false;
  std::string device = "cpu";
  std::optional<int> numLayers;
  std::string weightsPrefix; // keys of a submodule in a whole model's state_dict
  int64_t projSize = 0;
  double dropout = 0;
  std::string lengths, flatWeights, weightLayout = "pytorch";
  uint64_t seed = 0;
  int threads = 0; // 0: automatic (runtime/threads/ThreadGovernor.h)
  std::string weightsDtype = "fp32";
  PipelineFlags pipeline;
  // rnnc grad: the gradients flowing in, and where the gradients go.
  std::string gradOutput, gradHn, gradCn, grads;
  std::vector<std::string> gradFinals;
};

std::string stateNames(const ir::Cell& cell) {
  std::string names;
  for (const auto& state : cell.states)
    names += (names.empty() ? "" : ", ") + state->name;
  return names.empty() ? "none" : names;
}

// The state that --h0/--hn (h) or --c0/--cn (c) refer to; a clear error if the cell lacks it,
// as PyTorch refuses a cell state for a cell without one.
void requireState(const ir::Cell& cell, const std::string& state, const std::string& option) {
  const ir::Value* value = cell.findArgument(state);
  if (!value || value->argKind != ir::ArgKind::State)
    throw UserError(fmt::format("{} is given but cell '{}' has no state '{}' (its states: {}); "
                                "name states with --state/--final NAME=FILE",
                                option, cell.name, state, stateNames(cell)));
}

// Collects NAME -> FILE from the shorthand options and the repeated NAME=FILE option.
std::map<std::string, std::string> stateFiles(const ir::Cell& cell, const std::string& hFile,
                                              const std::string& hOption, const std::string& cFile,
                                              const std::string& cOption,
                                              const std::vector<std::string>& assignments,
                                              const std::string& option) {
  std::map<std::string, std::string> files;
  auto add = [&](const std::string& state, const std::string& file, const std::string& opt) {
    requireState(cell, state, opt);
    if (!files.emplace(state, file).second)
      throw UserError(fmt::format("state '{}' is given twice ({})", state, opt));
  };
  if (!hFile.empty())
    add("h", hFile, hOption);
  if (!cFile.empty())
    add("c", cFile, cOption);
  for (const auto& text : assignments) {
    auto [name, file] = splitAssignment(text, option);
    add(name, file, option + " " + name);
  }
  return files;
}

std::map<std::string, std::string> inputFiles(const ir::Cell& cell,
                                              const std::vector<std::string>& given) {
  std::vector<std::string> names;
  for (const auto& input : cell.inputs)
    names.push_back(input->name);
  std::map<std::string, std::string> files;
  for (const auto& text : given) {
    size_t eq = text.find('=');
    std::string name = eq == std::string::npos ? "" : text.substr(0, eq);
    const ir::Value* named = name.empty() ? nullptr : cell.findArgument(name);
    std::string file;
    if (named && named->argKind == ir::ArgKind::Input) {
      file = text.substr(eq + 1);
    } else if (cell.inputs.size() == 1 && given.size() == 1) {
      name = cell.inputs[0]->name;
      file = text;
    } else {
      throw UserError(fmt::format("--input {}: cell '{}' has the inputs {}; give each as --input "
                                  "NAME=FILE",
                                  text, cell.name, fmt::join(names, ", ")));
    }
    if (!files.emplace(name, file).second)
      throw UserError(fmt::format("input '{}' is given twice (--input)", name));
  }
  return files;
}

// The weights as a PyTorch state_dict, from a safetensors file or a flat buffer, in PyTorch's or
// MIOpen's gate order.
TensorMap loadWeights(const RunOptions& o, const std::string& mode) {
  if (o.weights.empty() == o.flatWeights.empty())
    throw UserError("give the weights with exactly one of --weights and --flat-weights");
  TensorMap weights;
  if (!o.weights.empty()) {
    // Used at once, by this process only: left in the file's pages rather than copied.
    weights = readWeightFile(o.weights, TensorReading::inPlace);
    if (!o.weightsPrefix.empty()) {
      std::vector<std::string> ignored;
      weights = selectPrefixed(weights, o.weightsPrefix, o.weights, &ignored);
      if (!ignored.empty())
        fmt::print(stderr, "rnnc: note: {}: ignoring {} tensor{} outside '{}' ({}{})\n", o.weights,
                   ignored.size(), ignored.size() == 1 ? "" : "s", o.weightsPrefix, ignored.front(),
                   ignored.size() > 1 ? ", ..." : "");
    }
  } else {
    ir::SizeMap sizes = parseSizes(o.sizes);
    for (const char* needed : {"input_size", "hidden_size"})
      if (!sizes.count(needed))
        throw UserError(std::string("--flat-weights needs the layout: give --size ") + needed +
                        "=VALUE (and --num-layers, --bidirectional, --proj-size as they apply)");
    FlatLayout layout{mode,       sizes.at("input_size"),  sizes.at("hidden_size"),
                      o.projSize, o.numLayers.value_or(1), o.bidirectional};
    FileBytes file = mapFileBytes(o.flatWeights);
    NpyFloat32View flat = viewNpyFloat32(file.view(), o.flatWeights);
    weights = unflattenWeights(flat.shape, flat.data, layout, o.flatWeights);
  }
  if (o.weightLayout == "miopen")
    weights = swapMIOpenGateOrder(weights, mode);
  return weights;
}

// Everything `run` and `grad` read: the cell, its weights and the layer's request and options.
struct LayerJob {
  std::unique_ptr<ir::Cell> cell;
  TensorMap weights;
  LayerRequest request;
  LayerOptions options;
  std::map<std::string, std::string> finals; // state -> where its final value goes
};

LayerJob prepareJob(const RunOptions& o) {
  if (o.numLayers && *o.numLayers < 1)
    throw UserError(fmt::format("--num-layers must be at least 1, got {}", *o.numLayers));
  auto cell = frontend::loadCell(o.cell); // a bad cell name or file is reported first
  // Flat weights are laid out before there are weights to look at: --proj-size decides.
  TensorMap weights = loadWeights(o, projectedCell(o.cell, o.projSize > 0));
  if (std::string name = projectedCell(o.cell, o.projSize > 0 || holdsProjection(weights));
      name != o.cell)
    cell = frontend::loadCell(name);
  if (o.projSize > 0) {
    auto it = weights.find("weight_hr_l0");
    if (it == weights.end() || it->second.dim(0) != o.projSize)
      throw UserError(fmt::format("--proj-size {} is given but {} {}", o.projSize, o.weights,
                                  it == weights.end()
                                      ? std::string("has no projection weight 'weight_hr_l0'")
                                      : "has 'weight_hr_l0' of shape " + it->second.shapeString() +
                                            ", expected [" + std::to_string(o.projSize) +
                                            ", hidden_size]"));
  }

  LayerJob job;
  job.weights = std::move(weights);
  LayerRequest& request = job.request;
  request.weights = &job.weights;
  request.weightsSource = o.weights.empty() ? o.flatWeights : o.weights;
  // The cell's first input is the layer's; the others are side inputs every layer reads.
  bool haveInput = false;
  for (const auto& [name, file] : inputFiles(*cell, o.inputs))
    if (name == cell->inputs[0]->name) {
      request.input = readNpyFloat32(file);
      haveInput = true;
    } else {
      request.sideInputs[name] = readNpyFloat32(file);
    }
  if (!haveInput)
    throw UserError(cell->inputs.size() == 1
                        ? std::string("give the input sequence with --input FILE")
                        : fmt::format("give cell '{}''s first input with --input {}=FILE",
                                      cell->name, cell->inputs[0]->name));
  for (const auto& [name, file] :
       stateFiles(*cell, o.h0, "--h0", o.c0, "--c0", o.states, "--state"))
    request.initialStates[name] = readNpyFloat32(file);
  if (!o.lengths.empty())
    request.lengths = readNpyInt64(o.lengths);
  job.finals = stateFiles(*cell, o.hn, "--hn", o.cn, "--cn", o.finals, "--final");

  LayerOptions& options = job.options;
  options.numLayers = o.numLayers;
  if (o.bidirectional)
    options.bidirectional = true;
  options.batchFirst = o.batchFirst;
  if (!(o.dropout >= 0 && o.dropout < 1)) // NaN too
    throw UserError(fmt::format("--dropout must be in [0, 1), got {}", o.dropout));
  options.dropout = o.dropout;
  options.training = o.train;
  options.seed = o.seed;
  checkThreadsOption(o.threads);
  options.threads = o.threads;
  options.sizes = parseSizes(o.sizes);
  if (!o.flatWeights.empty()) {
    // Those laid out the flat buffer; the weights carry them now, and input_size differs past
    // layer 0.
    options.sizes.erase("input_size");
    options.sizes.erase("hidden_size");
  }
  options.engine = engineFor(o.device, o.interpret, "--device", "--interpret");
  options.compile.pipeline = o.pipeline.options();
  options.compile.log = &std::cerr;
  options.compile.weights = codegen::parseWeightType(o.weightsDtype);
  job.cell = std::move(cell);
  return job;
}

int run(const RunOptions& o) {
  LayerJob job = prepareJob(o);
  job.request.movableWeights = &job.weights; // read for this run only: the layers take them
  LayerResult result = runLayers(*job.cell, job.request, job.options);
  writeNpy(o.output, result.output);
  for (const auto& [name, file] : job.finals)
    writeNpy(file, result.finalStates.at(name));
  return 0;
}

// rnnc grad: the gradients of loss = sum(Y * DY) + sum(h_n * DHN) + sum(c_n * DCN) (+ any
// state's), as torch.autograd.backward gives them with those grad tensors.
int grad(const RunOptions& o) {
  LayerJob job = prepareJob(o);
  GradientRequest request;
  static_cast<LayerRequest&>(request) = job.request;
  if (!o.gradOutput.empty())
    request.gradOutput = readNpyFloat32(o.gradOutput);
  for (const auto& [name, file] : stateFiles(*job.cell, o.gradHn, "--grad-hn", o.gradCn,
                                             "--grad-cn", o.gradFinals, "--grad-final"))
    request.gradFinalStates[name] = readNpyFloat32(file);
  GradientResult result = runGradients(*job.cell, request, job.options);
  writeSafeTensors(o.grads, result.gradients);
  if (!o.output.empty())
    writeNpy(o.output, result.forward.output);
  for (const auto& [name, file] : job.finals)
    writeNpy(file, result.forward.finalStates.at(name));
  return 0;
}

// The options `run` and `grad` share; `grad` writes the forward's results only when asked.
CLI::App* addLayerCommand(CLI::App& app, const std::string& name, const std::string& help,
                          const std::shared_ptr<RunOptions>& o, bool grad) {
  CLI::App* cmd = app.add_subcommand(name, help);
  cmd->add_option("--cell", o->cell, "Built-in cell name, .cell file or .rnnir IR dump")
      ->required();
  cmd->add_option(
      "--weights", o->weights,
      "Parameters under PyTorch's state_dict names: a safetensors file, or torch.save's "
      "(a state_dict, or a checkpoint nesting one: select it with --weights-prefix)");
  cmd->add_option("--flat-weights", o->flatWeights,
                  "Instead: one flat float32 buffer (.npy) in cuDNN/PyTorch order (per layer and "
                  "direction: weight_ih, weight_hh, bias_ih, bias_hh[, weight_hr]); needs --size "
                  "input_size=, --size hidden_size= and the layer options");
  cmd->add_option("--weight-layout", o->weightLayout,
                  "Gate order of the weights: pytorch (i,f,g,o / r,z,n) or miopen (i,f,o,g / "
                  "z,r,n)")
      ->check(CLI::IsMember({"pytorch", "miopen"}))
      ->default_val("pytorch");
  cmd->add_option("--input", o->inputs,
                  "Input sequence [T, B, I] (.npy); NAME=FILE for each input of a cell with "
                  "several (the first feeds layer 0, the others every layer at each step)")
      ->required();
  cmd->add_option("--output", o->output, "Where to write the outputs [T, B, H] (.npy)")
      ->required(!grad);
  cmd->add_option("--h0", o->h0,
                  "Initial hidden state h [num_layers * num_directions, B, H_out] (.npy); zeros "
                  "if absent");
  cmd->add_option("--c0", o->c0,
                  "Initial cell state c [num_layers * num_directions, B, H] (.npy); zeros if "
                  "absent");
  cmd->add_option("--state", o->states, "Initial value of any state: NAME=FILE (repeatable)");
  cmd->add_option("--hn", o->hn, "Where to write the final hidden states [L*D, B, H_out]");
  cmd->add_option("--cn", o->cn, "Where to write the final cell states [L*D, B, H]");
  cmd->add_option("--final", o->finals, "Where to write any final state: NAME=FILE (repeatable)");
  cmd->add_option("--size", o->sizes,
                  "Bind a named size: NAME=VALUE (repeatable); inferred "
                  "from the tensors otherwise");
  cmd->add_option("--num-layers", o->numLayers,
                  "Layers (checked against the weights: weight_ih_l0, weight_ih_l1, ...)");
  cmd->add_option("--weights-prefix", o->weightsPrefix,
                  "Take the tensors whose names start with this prefix (rnn. for a model's "
                  "self.rnn), without it; the others are ignored with a note");
  cmd->add_flag("--bidirectional", o->bidirectional,
                "Both directions (checked against the weights' _reverse tensors)");
  cmd->add_flag("--batch-first", o->batchFirst, "Input and output are [B, T, F]");
  cmd->add_option("--proj-size", o->projSize,
                  "LSTM projection size (checked against weight_hr_l0; inferred from it)");
  cmd->add_option("--lengths", o->lengths,
                  "Sequence lengths, int64 [B] (.npy), any order, each in [1, T]: outputs are "
                  "zero past them, final states taken at each sequence's last step");
  cmd->add_option("--dropout", o->dropout, "Dropout between layers, in training only");
  cmd->add_flag("--train", o->train, "Training mode: dropout between layers and in the cell");
  cmd->add_option("--seed", o->seed, "Seed of the dropout masks")->default_val(0);
  cmd->add_option("--threads", o->threads,
                  "Threads for the JIT (each step split between them); 0: automatic, every core "
                  "but fewer while other processes keep cores busy, and one for a call too short "
                  "to pay for starting threads")
      ->default_val(0);
  cmd->add_option("--weights-dtype", o->weightsDtype,
                  grad ? "Mixed precision: the weights of every linear/matmul stored as bf16 or "
                         "fp16 in the forward's and the backward's products (the gradients of "
                         "the forward that ran; everything else fp32), or fp32"
                       : "How the JIT stores the weights of every linear/matmul: fp32; fp16 "
                         "(half the bytes, widened to fp32 in registers); bf16 (half the bytes; "
                         "products of bf16 inputs and weights summed in fp32: on AMX tiles where "
                         "the CPU has them, by vdpbf16ps on AMD's AVX512_BF16); or int8 (dynamic "
                         "quantization). With --interpret, the interpreter computes its products "
                         "alike")
      ->default_val("fp32");
  cmd->add_option("--device", o->device,
                  "cpu (the JIT), cuda (an NVIDIA GPU through the CUDA driver: the cell's PTX "
                  "kernels) or cuda-emulated (those kernels' own code run on this CPU, GPU thread "
                  "after GPU thread: slow, for checking them without a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda", "cuda-emulated"}))
      ->default_val("cpu");
  cmd->add_flag("--interpret", o->interpret,
                "Run on the reference interpreter instead of the JIT (both draw the same dropout "
                "masks in training)");
  o->pipeline.addTo(*cmd);
  return cmd;
}

} // namespace

CommandAction addRunCommand(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  addLayerCommand(app, "run", "Run a cell over a sequence", o, false);
  return [o] { return run(*o); };
}

CommandAction addGradCommand(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = addLayerCommand(app, "grad",
                                  "Gradients of a layer by backpropagation through time (the "
                                  "backward derived from the cell), as torch.autograd gives them",
                                  o, true);
  cmd->add_option("--grad-output", o->gradOutput,
                  "dLoss/d(output), laid out as the output (.npy); zeros if absent");
  cmd->add_option("--grad-hn", o->gradHn, "dLoss/d(h_n) [L*D, B, H_out] (.npy); zeros if absent");
  cmd->add_option("--grad-cn", o->gradCn, "dLoss/d(c_n) [L*D, B, H] (.npy); zeros if absent");
  cmd->add_option("--grad-final", o->gradFinals,
                  "dLoss/d(any final state): NAME=FILE (repeatable); zeros if absent");
  cmd->add_option("--grads", o->grads,
                  "Where to write the gradients (.safetensors): every parameter under its "
                  "state_dict name, input, h0, c0 (any other state under its name)")
      ->required();
  return [o] { return grad(*o); };
}

} // namespace rnnc::tools

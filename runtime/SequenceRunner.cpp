#include "runtime/SequenceRunner.h"

#include "runtime/GpuCell.h"

#include "ir/Error.h"
#include "ir/Verifier.h"
#include "runtime/Weights.h"

#include <fmt/format.h>

namespace rnnc {
namespace {

std::string describeInput(const std::string& name, const Tensor& t) {
  return describeTensor("input '" + name + "'", t);
}
std::string describeState(const std::string& name, const Tensor& t) {
  return describeTensor("initial state '" + name + "'", t);
}

// Checks that every input is [T, B, F] with one T and one B, returning {T, B}.
std::pair<int64_t, int64_t> checkInputs(const ir::Cell& cell, const SequenceRequest& request) {
  if (cell.inputs.empty())
    throw UserError("cell '" + cell.name + "' has no input, so it has no sequence to run over");
  for (const auto& [name, tensor] : request.inputs)
    if (!cell.findArgument(name) || cell.findArgument(name)->argKind != ir::ArgKind::Input)
      throw UserError(fmt::format("cell '{}' has no input named '{}'", cell.name, name));
  int64_t steps = -1, batch = -1;
  std::string first;
  for (const auto& input : cell.inputs) {
    auto it = request.inputs.find(input->name);
    if (it == request.inputs.end())
      throw UserError(fmt::format("cell '{}' needs input '{}' of shape [T, B, {}]", cell.name,
                                  input->name, input->shape[1].str()));
    const Tensor& t = it->second;
    if (t.rank() != 3)
      throw UserError(fmt::format("{} has shape {}, expected [T, B, {}] (rank 3)",
                                  describeInput(input->name, t), t.shapeString(),
                                  input->shape[1].str()));
    if (steps < 0) {
      steps = t.dim(0);
      batch = t.dim(1);
      first = input->name;
    } else if (t.dim(0) != steps || t.dim(1) != batch) {
      throw UserError(fmt::format("{} has shape {} but input '{}' has T = {}, B = {}",
                                  describeInput(input->name, t), t.shapeString(), first, steps,
                                  batch));
    }
  }
  if (steps < 1 || batch < 1)
    throw UserError(fmt::format("input '{}' has an empty sequence or batch: T = {}, B = {}", first,
                                steps, batch));
  return {steps, batch};
}

} // namespace

SequenceResult runSequence(const ir::Cell& cell, const SequenceRequest& request) {
  RNNC_INTERNAL_CHECK(request.weights, "no weights given");
  auto [steps, batch] = checkInputs(cell, request);

  for (const auto& [name, tensor] : request.initialStates) {
    const ir::Value* state = cell.findArgument(name);
    if (!state || state->argKind != ir::ArgKind::State)
      throw UserError(fmt::format("an initial value is given for '{}', but cell '{}' has no "
                                  "state of that name",
                                  name, cell.name));
    if (tensor.rank() != 3 || tensor.dim(0) != 1 || tensor.dim(1) != batch)
      throw UserError(fmt::format("{} has shape {}, expected [1, B, {}] with B = {} from the "
                                  "inputs",
                                  describeState(name, tensor), tensor.shapeString(),
                                  state->shape[1].str(), batch));
  }

  // Infer the sizes from everything the user gave, weights first so their names show in errors.
  std::vector<ShapeObservation> observations;
  WeightLayout layout = inferWeightLayout(cell, *request.weights, request.weightsSource);
  if (layout.numLayers != 1 || layout.bidirectional)
    throw UserError(fmt::format("{}: holds {} layer(s){}; a single cell runs one layer in one "
                                "direction (layers run through runLayers, or rnnc run)",
                                request.weightsSource, layout.numLayers,
                                layout.bidirectional ? " in both directions" : ""));
  auto params = collectParameters(cell, *request.weights, request.weightsSource);
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].second) // null: a zero bias of a bias-free file, made below
      observations.push_back(
          {cell.params[i].get(), params[i].second->shape(),
           fmt::format("{}: tensor '{}'", request.weightsSource, params[i].first)});
  for (const auto& input : cell.inputs) {
    const Tensor& t = request.inputs.at(input->name);
    observations.push_back(
        {input.get(), {t.dim(1), t.dim(2)}, describeInput(input->name, t), {{"T", t.dim(0)}}});
  }
  for (const auto& state : cell.states)
    if (auto it = request.initialStates.find(state->name); it != request.initialStates.end())
      observations.push_back({state.get(),
                              {it->second.dim(1), it->second.dim(2)},
                              describeState(state->name, it->second),
                              {{"1", 1}}});
  ir::SizeMap sizes = solveCellSizes(cell, observations, request.sizes, batch);

  std::shared_ptr<ir::Cell> bound = cell.clone();
  bound->bindSizes(sizes);
  ir::verify(*bound);

  std::vector<Tensor> paramTensors;
  for (size_t i = 0; i < params.size(); ++i)
    paramTensors.push_back(params[i].second ? *params[i].second
                                            : Tensor({*cell.params[i]->shape[0].evaluate(sizes)}));
  std::vector<Tensor> inputs;
  for (const auto& input : cell.inputs)
    inputs.push_back(request.inputs.at(input->name));
  std::vector<Tensor> states;
  for (const auto& state : bound->states) {
    auto it = request.initialStates.find(state->name);
    int64_t features = *state->shape[1].evaluate(sizes);
    states.push_back(it != request.initialStates.end() ? it->second.reshaped({batch, features})
                                                       : Tensor({batch, features}));
  }

  SequenceResult result;
  result.engine = request.engine;
  if (request.options.training && ir::containsOp(*bound, ir::Op::Dropout)) {
    if (isGpuEngine(result.engine))
      throw UserError(fmt::format("cell '{}' has dropout, which in training mode runs on the "
                                  "interpreter only, not on {}",
                                  cell.name, engineName(result.engine)));
    result.engine = Engine::Interpreter; // the generated code implements inference dropout only
  }
  if (isGpuEngine(result.engine)) {
    GpuCell::Options options;
    options.pipeline = request.compile.pipeline;
    options.log = request.compile.log;
    auto gpu = GpuCell::compile(*bound, options);
    result.output = result.engine == Engine::Cuda ? gpu->run(paramTensors, inputs, states)
                                                  : gpu->emulate(paramTensors, inputs, states);
  } else if (result.engine == Engine::Jit) {
    result.output = [&] {
      Tensor output;
      CompiledCell::Workspace workspace;
      CompiledCell::compile(*bound, request.compile)
          ->run(paramTensors, inputs, states, output, workspace, request.threads);
      return output;
    }();
  } else {
    Interpreter interpreter(*bound, std::move(paramTensors), request.options);
    result.output = interpreter.run(inputs, states);
  }
  for (size_t i = 0; i < states.size(); ++i)
    result.finalStates[bound->states[i]->name] =
        states[i].reshaped({1, states[i].dim(0), states[i].dim(1)});
  result.boundCell = std::move(bound);
  return result;
}

Engine engineFor(const std::string& device, bool interpret, const std::string& deviceOption,
                 const std::string& interpreterOption) {
  if (device == "cpu")
    return interpret ? Engine::Interpreter : Engine::Jit;
  if (device != "cuda" && device != "cuda-emulated")
    throw UserError(
        fmt::format("{} must be cpu, cuda or cuda-emulated, not '{}'", deviceOption, device));
  if (interpret)
    throw UserError(fmt::format("{} runs on the CPU's interpreter; it does not go with {} {}",
                                interpreterOption, deviceOption, device));
  return device == "cuda" ? Engine::Cuda : Engine::CudaEmulated;
}

const char* engineName(Engine engine) {
  switch (engine) {
  case Engine::Jit:
    return "jit";
  case Engine::Interpreter:
    return "interpreter";
  case Engine::Cuda:
    return "cuda";
  case Engine::CudaEmulated:
    return "cuda-emulated";
  }
  return "?";
}

} // namespace rnnc

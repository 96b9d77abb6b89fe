#include "runtime/layers/LayerRunner.h"

#include "runtime/gpu/CudaDriver.h"

#include "codegen/WeightType.h"
#include "ir/Error.h"
#include "passes/TrainingDropout.h"
#include "runtime/data/Weights.h"
#include "runtime/exec/Hash.h"
#include "runtime/layers/DirectionRun.h"
#include "runtime/threads/ThreadTeam.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

namespace rnnc {
namespace {

// Tensors by name, shared with whoever keeps them (a training forward's tape).
using SharedTensors = std::map<std::string, std::shared_ptr<const Tensor>>;

// The shape observations of one layer and direction: its parameters, its input and the
// initial states given for it. inferSizes over them gives every size, or an error naming the
// tensor, both shapes and where each size came from.
std::vector<ShapeObservation> observe(const ir::Cell& cell, const LayerProgram::Slot& slot,
                                      const std::string& weightsSource, const Tensor* layerInput,
                                      int64_t batch, int layer,
                                      const std::map<std::string, Tensor>& initialStates,
                                      int64_t slots, const SharedTensors& sideInputs = {}) {
  std::vector<ShapeObservation> observations;
  // The cell's parameters; a slot's own past them (a training run's dropout masks) are not.
  for (size_t i = 0; i < cell.params.size(); ++i)
    if (slot.params[i].rank() > 0) // not a zero bias of a bias-free file, made later
      observations.push_back({cell.params[i].get(), slot.params[i].shape(),
                              fmt::format("{}: tensor '{}'", weightsSource, slot.paramNames[i])});
  if (layerInput)
    observations.push_back(
        {cell.inputs[0].get(),
         {batch, layerInput->dim(2)},
         layer == 0
             ? describeTensor("input", *layerInput)
             : fmt::format("the input of layer {} (the output of layer {})", layer, layer - 1),
         {{"T", layerInput->dim(0)}}});
  for (const auto& [name, tensor] : sideInputs)
    observations.push_back({cell.findArgument(name),
                            {batch, tensor->dim(2)},
                            describeTensor(fmt::format("side input '{}'", name), *tensor),
                            {{"T", tensor->dim(0)}}});
  for (const auto& state : cell.states) {
    auto it = initialStates.find(state->name);
    if (it != initialStates.end())
      observations.push_back(
          {state.get(),
           {batch, it->second.dim(2)},
           describeTensor(fmt::format("initial state '{}'", state->name), it->second),
           {{"num_layers * num_directions", slots}}});
  }
  return observations;
}

} // namespace

std::shared_ptr<const LayerProgram> LayerProgram::build(const ir::Cell& cell,
                                                        const TensorMap& weights,
                                                        const std::string& weightsSource,
                                                        const LayerOptions& options,
                                                        const LayerRequest* shapesOf) {
  return buildTaking(cell, weights, nullptr, weightsSource, options, shapesOf);
}

std::shared_ptr<const LayerProgram> LayerProgram::build(const ir::Cell& cell, TensorMap&& weights,
                                                        const std::string& weightsSource,
                                                        const LayerOptions& options,
                                                        const LayerRequest* shapesOf) {
  return buildTaking(cell, weights, &weights, weightsSource, options, shapesOf);
}

std::shared_ptr<const LayerProgram>
LayerProgram::buildTaking(const ir::Cell& cell, const TensorMap& weights, TensorMap* movable,
                          const std::string& weightsSource, const LayerOptions& options,
                          const LayerRequest* shapesOf) {
  checkThreadCount(options.threads); // before any compiling
  if (options.numLayers && *options.numLayers < 1)
    throw UserError(fmt::format("a layer needs at least 1 layer, not {}", *options.numLayers));
  if (!(options.dropout >= 0 && options.dropout < 1)) // NaN too
    throw UserError(fmt::format("dropout must be in [0, 1), not {}", options.dropout));
  if (options.compile.weights != codegen::WeightType::F32) {
    // The interpreter rounds (or quantizes) its products as the generated code does
    // (withProductsAs); what the JIT's storage plan refuses, it refuses too.
    if (options.engine == Engine::Interpreter)
      checkReducedWeightsChangeSomething(cell, options.compile.weights);
    if (options.training && options.compile.weights == codegen::WeightType::I8)
      throw UserError("int8 weights are for inference: train in fp32, bf16 or fp16, then run the "
                      "trained weights as int8");
  }
  if (options.engine == Engine::Cuda)
    CudaDriver::get(); // no GPU: say so before compiling anything
  WeightLayout layout = inferWeightLayout(cell, weights, weightsSource);
  if (cell.params.empty()) { // no weights to count: the layers and directions asked for
    layout.numLayers = options.numLayers.value_or(1);
    layout.bidirectional = options.bidirectional.value_or(false);
  }
  if (options.numLayers && *options.numLayers != layout.numLayers)
    throw UserError(fmt::format("{} holds {} layer(s) of cell '{}', but {} were asked for",
                                weightsSource, layout.numLayers, cell.name, *options.numLayers));
  if (options.bidirectional && *options.bidirectional != layout.bidirectional)
    throw UserError(fmt::format("{} holds {} weights, but a {} layer was asked for", weightsSource,
                                layout.bidirectional ? "bidirectional (_reverse)" : "one-direction",
                                *options.bidirectional ? "bidirectional" : "one-direction"));
  auto program = std::shared_ptr<LayerProgram>(new LayerProgram);
  program->cell_ = cell.clone();
  program->weightsSource_ = weightsSource;
  program->options_ = options;
  program->numLayers_ = layout.numLayers;
  program->directions_ = layout.bidirectional ? 2 : 1;

  // What a request shows of the sizes: its input and side inputs in [T, B, F] layout and its
  // initial states, those whose other dimensions fit (the rest are left to run() to explain).
  const int64_t slotCount = layout.numLayers * program->directions_;
  Tensor givenInput;
  std::map<std::string, Tensor> givenStates;
  SharedTensors givenSides;
  auto timeMajor = [&](const Tensor& t) { return options.batchFirst ? swapLeadingDims(t) : t; };
  if (shapesOf && shapesOf->input.rank() == 3) {
    givenInput = timeMajor(shapesOf->input);
    auto fits = [&](const Tensor& t, int64_t first, int64_t second) {
      return t.rank() == 3 && t.dim(0) == first && t.dim(1) == second;
    };
    for (const auto& [name, tensor] : shapesOf->sideInputs)
      if (const ir::Value* value = cell.findArgument(name);
          value && value->argKind == ir::ArgKind::Input && value != cell.inputs[0].get() &&
          tensor.rank() == 3 && fits(timeMajor(tensor), givenInput.dim(0), givenInput.dim(1)))
        givenSides[name] = std::make_shared<const Tensor>(timeMajor(tensor));
    for (const auto& [name, tensor] : shapesOf->initialStates)
      if (const ir::Value* value = cell.findArgument(name);
          value && value->argKind == ir::ArgKind::State &&
          fits(tensor, slotCount, givenInput.dim(1)))
        givenStates[name] = tensor;
  }

  // Movable weights are taken, each once: a tensor two slots name is copied.
  std::map<std::string, int> uses;
  if (movable)
    for (int layer = 0; layer < layout.numLayers; ++layer)
      for (int direction = 0; direction < program->directions_; ++direction)
        for (const auto& [name, tensor] :
             collectParameters(cell, weights, weightsSource, layer, direction == 1))
          ++uses[name];
  auto take = [&](const std::string& name, const Tensor& tensor) {
    return movable && uses[name] == 1 ? std::move(movable->at(name)) : tensor;
  };
  int64_t previousOutput = 0;   // features of the previous layer's output
  std::vector<size_t> jitSlots; // compiled together once every slot's sizes are known
  for (int layer = 0; layer < layout.numLayers; ++layer) {
    int64_t layerOutput = 0;
    for (int direction = 0; direction < program->directions_; ++direction) {
      Slot slot;
      std::vector<size_t> zeroBiases; // bias=False: zeros once the sizes are known
      for (const auto& [name, tensor] :
           collectParameters(cell, weights, weightsSource, layer, direction == 1)) {
        if (!tensor)
          zeroBiases.push_back(slot.params.size());
        slot.paramNames.push_back(name);
        slot.params.push_back(tensor ? take(name, *tensor) : Tensor());
        slot.inWeights.push_back(tensor != nullptr);
      }
      // Sizes from the weights (and, past layer 0, the previous layer's width; at layer 0, what
      // a request shows).
      Tensor previous;
      if (layer > 0)
        previous = Tensor({1, 1, previousOutput});
      const bool requestShapes = layer == 0 && givenInput.rank() == 3;
      const int64_t batch = requestShapes ? givenInput.dim(1) : 1;
      ir::SizeMap sizes =
          solveCellSizes(cell,
                         requestShapes ? observe(cell, slot, weightsSource, &givenInput, batch, 0,
                                                 givenStates, slotCount, givenSides)
                                       : observe(cell, slot, weightsSource,
                                                 layer > 0 ? &previous : nullptr, 1, layer, {}, 0),
                         options.sizes, batch);
      slot.bound = cell.clone();
      slot.bound->bindSizes(sizes);
      for (size_t i : zeroBiases)
        slot.params[i] = Tensor({*cell.params[i]->shape[0].evaluate(sizes)});
      // Dropout in training: its masks explicit (passes/TrainingDropout.h), drawn alike by the
      // JIT and the interpreter; the GPU's code draws none.
      const bool trainingDropout = options.training && ir::containsOp(*slot.bound, ir::Op::Dropout);
      if (trainingDropout) {
        passes::lowerTrainingDropout(*slot.bound);
        // A dropout of parameters alone: one mask for the run, a parameter of the slot's.
        const uint64_t seed = options.maskSeedOf(static_cast<int64_t>(program->slots_.size()));
        for (const passes::ParameterDropout& d : passes::lowerParameterDropout(*slot.bound)) {
          TensorShape shape;
          for (const ir::Dim& dim : d.mask->shape)
            shape.push_back(*dim.evaluate(sizes));
          Tensor mask(std::move(shape));
          const int64_t columns = mask.rank() == 0 ? 1 : mask.shape().back();
          for (int64_t row = 0; row < mask.numel() / columns; ++row)
            fillDropoutMaskRow(seed, static_cast<uint64_t>(d.stream), static_cast<uint64_t>(row),
                               d.p, mask.data() + row * columns, columns);
          slot.paramNames.push_back(d.mask->name);
          slot.params.push_back(std::move(mask));
          slot.inWeights.push_back(false);
          slot.parameterMasks = true;
        }
      }
      if (isGpuEngine(options.engine)) {
        if (trainingDropout)
          throw UserError(fmt::format("cell '{}' has dropout, which in training mode runs on the "
                                      "CPU only (the JIT or the interpreter), not on {}",
                                      cell.name, engineName(options.engine)));
        GpuCell::Options gpu;
        gpu.pipeline = options.compile.pipeline;
        gpu.log = options.compile.log;
        slot.gpu = GpuCell::compile(*slot.bound, gpu);
      } else if (options.engine == Engine::Jit) {
        jitSlots.push_back(program->slots_.size());
      }
      layerOutput += ir::columnsOf(slot.bound->output);
      if (layer == 0 && direction == 0)
        program->inputSize_ = ir::columnsOf(slot.bound->inputs[0].get());
      program->slots_.push_back(std::move(slot));
    }
    previousOutput = layerOutput;
  }
  std::vector<const ir::Cell*> jitCells;
  for (size_t i : jitSlots)
    jitCells.push_back(program->slots_[i].bound.get());
  std::vector<std::shared_ptr<CompiledCell>> compiled =
      CompiledCell::compileAll(jitCells, options.compile);
  for (size_t j = 0; j < jitSlots.size(); ++j)
    program->slots_[jitSlots[j]].compiled = std::move(compiled[j]);
  // The parameter-only work once, now that the slots (and their parameters) are in place.
  program->threads_ = options.threads;
  for (Slot& slot : program->slots_)
    if (slot.compiled)
      slot.prepared = slot.compiled->prepare(slot.params, program->threads_);
  program->outputSize_ = previousOutput;
  return program;
}

LayerResult LayerProgram::run(const Tensor& input,
                              const std::map<std::string, Tensor>& initialStates,
                              const std::optional<Int64Array>& lengths,
                              const std::map<std::string, Tensor>& sideInputs,
                              const SlotRunner& slotRunner,
                              std::optional<uint64_t> dropoutSeed) const {
  // Without a slot runner nothing holds the input past this call: it is read where it lies,
  // through a pointer that owns nothing (the default LSTM's input is 13 MB, a copy of it ~1% of
  // a training step). A slot runner (the training forward) keeps it for the backward: a copy.
  return runOn(slotRunner ? std::make_shared<const Tensor>(input)
                          : std::shared_ptr<const Tensor>(std::shared_ptr<const Tensor>(), &input),
               initialStates, lengths, sideInputs, slotRunner, dropoutSeed);
}

LayerResult LayerProgram::run(Tensor&& input, const std::map<std::string, Tensor>& initialStates,
                              const std::optional<Int64Array>& lengths,
                              const std::map<std::string, Tensor>& sideInputs,
                              const SlotRunner& slotRunner,
                              std::optional<uint64_t> dropoutSeed) const {
  return runOn(std::make_shared<const Tensor>(std::move(input)), initialStates, lengths, sideInputs,
               slotRunner, dropoutSeed);
}

LayerResult LayerProgram::runOn(std::shared_ptr<const Tensor> given,
                                const std::map<std::string, Tensor>& initialStates,
                                const std::optional<Int64Array>& lengthsGiven,
                                const std::map<std::string, Tensor>& sideInputs,
                                const SlotRunner& slotRunner,
                                std::optional<uint64_t> dropoutSeed) const {
  const ir::Cell& cell = *cell_;
  const Tensor& rawInput = *given;
  const std::string inputLayout = options_.batchFirst ? "[B, T, input_size]" : "[T, B, input_size]";
  if (rawInput.rank() != 3)
    throw UserError(fmt::format("{} has shape {}, expected {} (rank 3)",
                                describeTensor("input", rawInput), rawInput.shapeString(),
                                inputLayout));
  // Shared: a training forward keeps each layer's input for its backward.
  std::shared_ptr<const Tensor> input =
      options_.batchFirst ? std::make_shared<const Tensor>(swapLeadingDims(rawInput)) : given;
  const int64_t steps = input->dim(0), batch = input->dim(1);
  if (steps < 1 || batch < 1)
    throw UserError(fmt::format("{} has shape {}: T and B must be at least 1",
                                describeTensor("input", rawInput), rawInput.shapeString()));
  const int64_t slots = static_cast<int64_t>(slots_.size());
  std::vector<int64_t> lengths = checkedLengths(lengthsGiven, steps, batch);
  for (const auto& [name, tensor] : initialStates) {
    const ir::Value* state = cell.findArgument(name);
    if (!state || state->argKind != ir::ArgKind::State)
      throw UserError(fmt::format("an initial value is given for '{}', but cell '{}' has no "
                                  "state of that name",
                                  name, cell.name));
    if (tensor.rank() != 3 || tensor.dim(0) != slots || tensor.dim(1) != batch)
      throw UserError(fmt::format("{} has shape {}, expected [num_layers * "
                                  "num_directions, B, {}] = [{}, {}, {}]",
                                  describeTensor(fmt::format("initial state '{}'", name), tensor),
                                  tensor.shapeString(), state->shape[1].str(), slots, batch,
                                  stateSize(name)));
  }

  SharedTensors sides; // shared, as the layer's input is
  for (auto& [name, tensor] : checkedSideInputs(sideInputs, steps, batch))
    sides[name] = std::make_shared<const Tensor>(std::move(tensor));

  LayerResult result;
  result.numLayers = numLayers_;
  result.bidirectional = directions_ == 2;
  std::vector<std::vector<Tensor>> finals(cell.states.size()); // per state, per slot
  std::shared_ptr<const Tensor> layerInput = std::move(input);
  std::shared_ptr<Tensor> lastOutput; // the last layer's, which nothing may hold yet
  for (int layer = 0; layer < numLayers_; ++layer) {
    std::vector<Tensor> directionOutputs;
    for (int direction = 0; direction < directions_; ++direction) {
      const int64_t index = layer * directions_ + direction;
      const Slot& slot = slots_[static_cast<size_t>(index)];
      // Every tensor the caller gave, checked against the weights with full explanations.
      solveCellSizes(cell,
                     observe(cell, slot, weightsSource_, layerInput.get(), batch, layer,
                             initialStates, slots, sides),
                     options_.sizes, batch);
      std::vector<Tensor> states;
      for (const auto& state : slot.bound->states) {
        auto it = initialStates.find(state->name);
        int64_t features = ir::columnsOf(state.get());
        states.push_back(it == initialStates.end()
                             ? Tensor({batch, features})
                             : Tensor({batch, features},
                                      std::vector<float>(row(it->second, index * batch),
                                                         row(it->second, (index + 1) * batch))));
      }
      // The layer's input, then the side inputs, each read where it is.
      std::vector<std::shared_ptr<const Tensor>> inputTensors = {layerInput};
      for (size_t i = 1; i < cell.inputs.size(); ++i)
        inputTensors.push_back(sides.at(cell.inputs[i]->name));
      DirectionRun out;
      if (slotRunner) {
        out = slotRunner(index, inputTensors, steps, batch, std::move(states), lengths,
                         direction == 1);
      } else {
        CellInputs inputs;
        for (const auto& tensor : inputTensors)
          inputs.push_back(InputRows::of(*tensor));
        ExecutionOptions execution = withProductsAs(
            options_.compile.weights, {options_.training, options_.maskSeedOf(index)});
        Executor run = slot.gpu
                           ? gpuExecutor(slot.gpu, slot.params, options_.engine == Engine::Cuda)
                       : slot.compiled ? jitExecutor(slot.compiled, slot.prepared, threads_,
                                                     slot.workspaces, execution.seed)
                                       : interpreterExecutor(std::make_shared<Interpreter>(
                                             *slot.bound, slot.params, execution));
        out = runDirection(run, inputs, steps, batch, std::move(states), lengths, direction == 1);
      }
      for (size_t s = 0; s < out.final.size(); ++s)
        finals[s].push_back(std::move(out.final[s]));
      directionOutputs.push_back(std::move(out.output));
    }
    // Directions side by side: [T, B, H] + [T, B, H] -> [T, B, 2H].
    Tensor layerOutput;
    if (directions_ == 2) {
      const int64_t h = directionOutputs[0].dim(2);
      layerOutput = Tensor::uninitialized({steps, batch, 2 * h});
      for (int64_t r = 0; r < steps * batch; ++r)
        for (int d = 0; d < 2; ++d)
          std::memcpy(row(layerOutput, r) + d * h, row(directionOutputs[d], r),
                      static_cast<size_t>(h) * sizeof(float));
    } else {
      layerOutput = std::move(directionOutputs[0]);
    }
    if (options_.training && options_.dropout > 0 && layer + 1 < numLayers_)
      dropoutBetweenLayers(layerOutput, options_.dropout, dropoutSeed.value_or(options_.seed),
                           layer);
    lastOutput = std::make_shared<Tensor>(std::move(layerOutput));
    layerInput = lastOutput;
  }

  // The last layer's output, moved out unless a slot runner keeps it.
  layerInput.reset();
  Tensor output = lastOutput.use_count() == 1 ? std::move(*lastOutput) : *lastOutput;
  result.output = options_.batchFirst ? swapLeadingDims(output) : std::move(output);
  for (size_t s = 0; s < cell.states.size(); ++s) {
    const int64_t features = finals[s][0].dim(1);
    Tensor all({slots, batch, features});
    for (int64_t index = 0; index < slots; ++index)
      std::copy(finals[s][index].data(), finals[s][index].data() + finals[s][index].numel(),
                row(all, index * batch));
    result.finalStates[cell.states[s]->name] = std::move(all);
  }
  return result;
}

std::map<std::string, Tensor>
LayerProgram::checkedSideInputs(const std::map<std::string, Tensor>& given, int64_t steps,
                                int64_t batch) const {
  const ir::Cell& cell = *cell_;
  const std::string layout = options_.batchFirst ? "[B, T, F]" : "[T, B, F]";
  std::map<std::string, Tensor> sides;
  for (const auto& [name, tensor] : given) {
    const ir::Value* value = cell.findArgument(name);
    if (!value || value->argKind != ir::ArgKind::Input)
      throw UserError(fmt::format("a side input '{}' is given, but cell '{}' has no input of that "
                                  "name",
                                  name, cell.name));
    if (value == cell.inputs[0].get())
      throw UserError(fmt::format("'{}' is the first input of cell '{}', the layer's input: it is "
                                  "given as the input, not as a side input",
                                  name, cell.name));
    if (tensor.rank() != 3)
      throw UserError(fmt::format("{} has shape {}, expected {} (rank 3)",
                                  describeTensor(fmt::format("side input '{}'", name), tensor),
                                  tensor.shapeString(), layout));
    Tensor t = options_.batchFirst ? swapLeadingDims(tensor) : tensor;
    if (t.dim(0) != steps || t.dim(1) != batch)
      throw UserError(fmt::format("{} has shape {}, but the input has T = {} and B = {} ({})",
                                  describeTensor(fmt::format("side input '{}'", name), tensor),
                                  tensor.shapeString(), steps, batch, layout));
    sides[name] = std::move(t);
  }
  for (size_t i = 1; i < cell.inputs.size(); ++i)
    if (!sides.count(cell.inputs[i]->name))
      throw UserError(fmt::format("cell '{}' reads the side input '{}' ({} with F = {}) beside "
                                  "its input '{}', but none is given",
                                  cell.name, cell.inputs[i]->name, layout,
                                  cell.inputs[i]->shape[1].str(), cell.inputs[0]->name));
  return sides;
}

std::vector<std::string> LayerProgram::sideInputNames() const {
  std::vector<std::string> names;
  for (size_t i = 1; i < cell_->inputs.size(); ++i)
    names.push_back(cell_->inputs[i]->name);
  return names;
}

int64_t LayerProgram::sideInputSize(const std::string& name) const {
  const ir::Value* value = slots_.at(0).bound->findArgument(name);
  if (!value || value->argKind != ir::ArgKind::Input || value == slots_[0].bound->inputs[0].get())
    throw UserError(fmt::format("cell '{}' has no side input '{}'", cell_->name, name));
  return ir::columnsOf(value);
}

int64_t LayerProgram::stateSize(const std::string& state) const {
  const ir::Value* value = slots_.at(0).bound->findArgument(state);
  RNNC_INTERNAL_CHECK(value && value->argKind == ir::ArgKind::State, "no state " + state);
  return ir::columnsOf(value);
}

LayerResult runLayers(const ir::Cell& cell, const LayerRequest& request,
                      const LayerOptions& options) {
  RNNC_INTERNAL_CHECK(request.weights, "no weights given");
  auto program =
      request.movableWeights
          ? LayerProgram::build(cell, std::move(*request.movableWeights), request.weightsSource,
                                options, &request)
          : LayerProgram::build(cell, *request.weights, request.weightsSource, options, &request);
  return program->run(request.input, request.initialStates, request.lengths, request.sideInputs);
}

} // namespace rnnc

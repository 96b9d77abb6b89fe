#include "runtime/LayerRunner.h"

#include "codegen/StoragePlan.h"
#include "ir/Error.h"
#include "runtime/Hash.h"
#include "runtime/PackedBatch.h"
#include "runtime/Weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

namespace rnnc {
namespace {

// Runs a bound cell, the JIT or the interpreter. `padded`: inputs [T, B, F], states [B, F]
// updated, returns outputs [T, B, H]. `packed`: the same over a packed batch (see
// CompiledCell::runPacked), input [N, F], returns outputs [N, H].
struct Executor {
  std::function<Tensor(const Tensor& input, std::vector<Tensor>& states)> padded;
  std::function<Tensor(const Tensor& input, const std::vector<int64_t>& batchSizes,
                       std::vector<Tensor>& states)>
      packed;
};

// Row `index` of a [N, F] or [A, B, F] tensor viewed as rows of its last dimension.
float* row(Tensor& t, int64_t index) {
  return t.data() + index * t.shape().back();
}
const float* row(const Tensor& t, int64_t index) {
  return t.data() + index * t.shape().back();
}

// [A, B, F] -> [B, A, F].
Tensor swapLeadingDims(const Tensor& t) {
  const int64_t a = t.dim(0), b = t.dim(1), f = t.dim(2);
  Tensor out({b, a, f});
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      std::memcpy(row(out, j * a + i), row(t, i * b + j), static_cast<size_t>(f) * sizeof(float));
  return out;
}

// [..., F0], [..., F1], ... -> [..., F0 + F1 + ...]: the layer's input and its side inputs as
// one tensor, so that sorting, reversing and packing move them together.
Tensor concatFeatures(const std::vector<const Tensor*>& parts) {
  TensorShape shape = parts[0]->shape();
  shape.back() = 0;
  for (const Tensor* part : parts)
    shape.back() += part->shape().back();
  Tensor out(shape);
  const int64_t rows = out.numel() / std::max<int64_t>(shape.back(), 1);
  for (int64_t r = 0; r < rows; ++r) {
    float* to = row(out, r);
    for (const Tensor* part : parts) {
      const int64_t width = part->shape().back();
      std::memcpy(to, row(*part, r), static_cast<size_t>(width) * sizeof(float));
      to += width;
    }
  }
  return out;
}

// The inverse: the cell's inputs out of the combined tensor.
std::vector<Tensor> splitFeatures(const Tensor& t, const std::vector<int64_t>& widths) {
  if (widths.size() == 1)
    return {t};
  std::vector<Tensor> parts;
  const int64_t rows = t.numel() / std::max<int64_t>(t.shape().back(), 1);
  int64_t offset = 0;
  for (int64_t width : widths) {
    TensorShape shape = t.shape();
    shape.back() = width;
    Tensor part(shape);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(row(part, r), row(t, r) + offset, static_cast<size_t>(width) * sizeof(float));
    parts.push_back(std::move(part));
    offset += width;
  }
  return parts;
}

// A packed batch run one stretch of steps with the same active batch at a time, each stretch a
// padded run of its rows: for an executor with no packed entry of its own (the interpreter).
Tensor
runPackedByStretches(const std::function<Tensor(const Tensor&, std::vector<Tensor>&)>& padded,
                     const Tensor& input, const std::vector<int64_t>& batchSizes,
                     std::vector<Tensor>& states) {
  Tensor output;
  for (const Stretch& stretch : stretchesOf(batchSizes)) {
    const int64_t active = stretch.active, firstRow = stretch.firstRow;
    const int64_t rows = stretch.steps * active;
    Tensor segment({stretch.steps, active, input.dim(1)},
                   std::vector<float>(row(input, firstRow), row(input, firstRow + rows)));
    std::vector<Tensor> activeStates;
    for (const Tensor& state : states)
      activeStates.emplace_back(TensorShape{active, state.dim(1)},
                                std::vector<float>(state.data(), row(state, active)));
    Tensor out = padded(segment, activeStates);
    for (size_t s = 0; s < states.size(); ++s)
      std::copy(activeStates[s].data(), activeStates[s].data() + activeStates[s].numel(),
                states[s].data());
    if (output.numel() == 0)
      output = Tensor({input.dim(0), out.dim(2)});
    std::copy(out.data(), out.data() + out.numel(), row(output, firstRow));
  }
  return output;
}

// One direction of one layer over the whole batch. `lengths` empty: every sequence has T steps.
struct DirectionRun {
  Tensor output;             // [T, B, H], zero past each length
  std::vector<Tensor> final; // per state, [B, F]
};

DirectionRun runDirection(const Executor& run, const Tensor& input, std::vector<Tensor> states,
                          const std::vector<int64_t>& lengths, bool reverse) {
  const int64_t steps = input.dim(0), batch = input.dim(1), features = input.dim(2);
  DirectionRun result;
  bool padded = std::all_of(lengths.begin(), lengths.end(), [&](int64_t l) { return l == steps; });
  if (padded && !reverse) { // nothing to pack
    result.output = run.padded(input, states);
    result.final = std::move(states);
    return result;
  }

  // Sequences longest first (stable, so equal lengths keep their order): the active batch at
  // step t is then the prefix of the first batchSizes[t] sequences.
  std::vector<int64_t> order(static_cast<size_t>(batch));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<int64_t> batchSizes(static_cast<size_t>(steps));
  for (int64_t t = 0; t < steps; ++t)
    batchSizes[t] = std::count_if(lengths.begin(), lengths.end(), [&](int64_t l) { return l > t; });
  // Where step t of sorted sequence i lives in the padded tensors: reversed within its length.
  auto sourceStep = [&](int64_t t, int64_t i) { return reverse ? lengths[order[i]] - 1 - t : t; };
  // Packed row r <-> padded row: step after step, the active sequences of each.
  std::vector<int64_t> paddedRow;
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t i = 0; i < batchSizes[t]; ++i)
      paddedRow.push_back(sourceStep(t, i) * batch + order[i]);
  const int64_t packedRows = static_cast<int64_t>(paddedRow.size());

  for (Tensor& state : states) { // into sorted order
    Tensor sorted(state.shape());
    for (int64_t i = 0; i < batch; ++i)
      std::memcpy(row(sorted, i), row(state, order[i]),
                  static_cast<size_t>(state.dim(1)) * sizeof(float));
    state = std::move(sorted);
  }
  Tensor packed({packedRows, features});
  for (int64_t r = 0; r < packedRows; ++r)
    std::memcpy(row(packed, r), row(input, paddedRow[r]),
                static_cast<size_t>(features) * sizeof(float));

  Tensor out = run.packed ? run.packed(packed, batchSizes, states)
                          : runPackedByStretches(run.padded, packed, batchSizes, states);

  result.output = Tensor({steps, batch, out.dim(1)}); // zero past each length
  for (int64_t r = 0; r < packedRows; ++r)
    std::memcpy(row(result.output, paddedRow[r]), row(out, r),
                static_cast<size_t>(out.dim(1)) * sizeof(float));
  for (Tensor& state : states) { // back to the caller's order
    Tensor unsorted(state.shape());
    for (int64_t i = 0; i < batch; ++i)
      std::memcpy(row(unsorted, order[i]), row(state, i),
                  static_cast<size_t>(state.dim(1)) * sizeof(float));
    result.final.push_back(std::move(unsorted));
  }
  return result;
}

// Dropout on a layer's output before the next layer: zero with probability p, else scaled by
// 1 / (1 - p); the mask is a pure function of (seed, layer, element).
void dropoutBetweenLayers(Tensor& t, double p, uint64_t seed, int layer) {
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint64_t h = splitmix64(splitmix64(seed ^ (static_cast<uint64_t>(layer) << 40)) ^
                            static_cast<uint64_t>(i));
    double u = unitInterval(h);
    t.data()[i] = u < p ? 0.0f : t.data()[i] * scale;
  }
}

std::vector<int64_t> checkedLengths(const std::optional<Int64Array>& given, int64_t steps,
                                    int64_t batch) {
  if (!given)
    return std::vector<int64_t>(static_cast<size_t>(batch), steps);
  const Int64Array& lengths = *given;
  if (lengths.shape != TensorShape{batch})
    throw UserError(fmt::format("lengths has shape {}, expected [B] = [{}] (one length per "
                                "sequence of the batch)",
                                shapeToString(lengths.shape), batch));
  for (size_t i = 0; i < lengths.values.size(); ++i)
    if (lengths.values[i] < 1 || lengths.values[i] > steps)
      throw UserError(fmt::format("lengths[{}] = {} is out of range: lengths must be in [1, T] "
                                  "= [1, {}]",
                                  i, lengths.values[i], steps));
  return lengths.values;
}

// The shape observations of one layer and direction: its parameters, its input and the
// initial states given for it. inferSizes over them gives every size, or an error naming the
// tensor, both shapes and where each size came from.
std::vector<ShapeObservation> observe(const ir::Cell& cell, const LayerProgram::Slot& slot,
                                      const std::string& weightsSource, const Tensor* layerInput,
                                      int64_t batch, int layer,
                                      const std::map<std::string, Tensor>& initialStates,
                                      int64_t slots,
                                      const std::map<std::string, Tensor>& sideInputs = {}) {
  std::vector<ShapeObservation> observations;
  for (size_t i = 0; i < slot.params.size(); ++i)
    if (slot.params[i].rank() > 0) // not a zero bias of a bias-free file, made later
      observations.push_back({cell.params[i].get(), slot.params[i].shape(),
                              fmt::format("{}: tensor '{}'", weightsSource, slot.paramNames[i])});
  if (layerInput)
    observations.push_back(
        {cell.inputs[0].get(),
         {batch, layerInput->dim(2)},
         layer == 0
             ? std::string("input")
             : fmt::format("the input of layer {} (the output of layer {})", layer, layer - 1),
         {{"T", layerInput->dim(0)}}});
  for (const auto& [name, tensor] : sideInputs)
    observations.push_back({cell.findArgument(name),
                            {batch, tensor.dim(2)},
                            fmt::format("side input '{}'", name),
                            {{"T", tensor.dim(0)}}});
  for (const auto& state : cell.states) {
    auto it = initialStates.find(state->name);
    if (it != initialStates.end())
      observations.push_back({state.get(),
                              {batch, it->second.dim(2)},
                              fmt::format("initial state '{}'", state->name),
                              {{"num_layers * num_directions", slots}}});
  }
  return observations;
}

} // namespace

std::shared_ptr<const LayerProgram> LayerProgram::build(const ir::Cell& cell,
                                                        const TensorMap& weights,
                                                        const std::string& weightsSource,
                                                        const LayerOptions& options) {
  WeightLayout layout = inferWeightLayout(cell, weights, weightsSource);
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

  int64_t previousOutput = 0; // features of the previous layer's output
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
        slot.params.push_back(tensor ? *tensor : Tensor());
      }
      // Sizes from the weights (and, past layer 0, the previous layer's width).
      Tensor previous;
      if (layer > 0)
        previous = Tensor({1, 1, previousOutput});
      ir::SizeMap sizes = solveCellSizes(
          cell,
          observe(cell, slot, weightsSource, layer > 0 ? &previous : nullptr, 1, layer, {}, 0),
          options.sizes, 1);
      slot.bound = cell.clone();
      slot.bound->bindSizes(sizes);
      for (size_t i : zeroBiases)
        slot.params[i] = Tensor({*cell.params[i]->shape[0].evaluate(sizes)});
      // The generated code implements inference dropout only.
      bool interpret = options.engine == Engine::Interpreter ||
                       (options.training && ir::containsOp(*slot.bound, ir::Op::Dropout));
      if (!interpret)
        slot.compiled = CompiledCell::compile(*slot.bound, options.compile);
      layerOutput += codegen::columnsOf(slot.bound->output);
      if (layer == 0 && direction == 0)
        program->inputSize_ = codegen::columnsOf(slot.bound->inputs[0].get());
      program->slots_.push_back(std::move(slot));
    }
    previousOutput = layerOutput;
  }
  // The parameter-only work once, now that the slots (and their parameters) are in place.
  program->threads_ = options.threads;
  for (Slot& slot : program->slots_)
    if (slot.compiled)
      slot.prepared = slot.compiled->prepare(slot.params, program->threads_);
  program->outputSize_ = previousOutput;
  return program;
}

LayerResult LayerProgram::run(const Tensor& rawInput,
                              const std::map<std::string, Tensor>& initialStates,
                              const std::optional<Int64Array>& lengthsGiven,
                              const std::map<std::string, Tensor>& sideInputs) const {
  const ir::Cell& cell = *cell_;
  const std::string inputLayout = options_.batchFirst ? "[B, T, input_size]" : "[T, B, input_size]";
  if (rawInput.rank() != 3)
    throw UserError(fmt::format("input has shape {}, expected {} (rank 3)", rawInput.shapeString(),
                                inputLayout));
  Tensor input = options_.batchFirst ? swapLeadingDims(rawInput) : rawInput;
  const int64_t steps = input.dim(0), batch = input.dim(1);
  if (steps < 1 || batch < 1)
    throw UserError(
        fmt::format("input has shape {}: T and B must be at least 1", rawInput.shapeString()));
  const int64_t slots = static_cast<int64_t>(slots_.size());
  std::vector<int64_t> lengths = checkedLengths(lengthsGiven, steps, batch);
  for (const auto& [name, tensor] : initialStates) {
    const ir::Value* state = cell.findArgument(name);
    if (!state || state->argKind != ir::ArgKind::State)
      throw UserError(fmt::format("an initial value is given for '{}', but cell '{}' has no "
                                  "state of that name",
                                  name, cell.name));
    if (tensor.rank() != 3 || tensor.dim(0) != slots || tensor.dim(1) != batch)
      throw UserError(fmt::format("initial state '{}' has shape {}, expected [num_layers * "
                                  "num_directions, B, {}] = [{}, {}, {}]",
                                  name, tensor.shapeString(), state->shape[1].str(), slots, batch,
                                  state->shape[1].str()));
  }

  std::map<std::string, Tensor> sides = checkedSideInputs(sideInputs, steps, batch);

  LayerResult result;
  result.numLayers = numLayers_;
  result.bidirectional = directions_ == 2;
  std::vector<std::vector<Tensor>> finals(cell.states.size()); // per state, per slot
  Tensor layerInput = std::move(input);
  for (int layer = 0; layer < numLayers_; ++layer) {
    std::vector<Tensor> directionOutputs;
    for (int direction = 0; direction < directions_; ++direction) {
      const int64_t index = layer * directions_ + direction;
      const Slot& slot = slots_[static_cast<size_t>(index)];
      // Every tensor the caller gave, checked against the weights with full explanations.
      solveCellSizes(cell,
                     observe(cell, slot, weightsSource_, &layerInput, batch, layer, initialStates,
                             slots, sides),
                     options_.sizes, batch);
      std::vector<Tensor> states;
      for (const auto& state : slot.bound->states) {
        auto it = initialStates.find(state->name);
        int64_t features = codegen::columnsOf(state.get());
        states.push_back(it == initialStates.end()
                             ? Tensor({batch, features})
                             : Tensor({batch, features},
                                      std::vector<float>(row(it->second, index * batch),
                                                         row(it->second, (index + 1) * batch))));
      }
      // The side inputs travel beside the layer's input through sorting and packing, and are
      // split off again for the cell.
      std::vector<const Tensor*> parts = {&layerInput};
      std::vector<int64_t> widths = {layerInput.dim(2)};
      for (size_t i = 1; i < cell.inputs.size(); ++i) {
        parts.push_back(&sides.at(cell.inputs[i]->name));
        widths.push_back(parts.back()->dim(2));
      }
      Executor run;
      if (slot.compiled) {
        const int threads = threads_;
        run.padded = [&slot, threads, widths](const Tensor& in, std::vector<Tensor>& st) {
          Tensor output;
          CompiledCell::Workspace workspace;
          slot.compiled->run(*slot.prepared, splitFeatures(in, widths), st, output, workspace,
                             threads);
          return output;
        };
        run.packed = [&slot, threads, widths](const Tensor& in,
                                              const std::vector<int64_t>& batchSizes,
                                              std::vector<Tensor>& st) {
          Tensor output;
          CompiledCell::Workspace workspace;
          slot.compiled->runPacked(*slot.prepared, splitFeatures(in, widths), batchSizes, st,
                                   output, workspace, threads);
          return output;
        };
      } else {
        ExecutionOptions execution{options_.training, options_.seed + static_cast<uint64_t>(index)};
        auto interpreter = std::make_shared<Interpreter>(*slot.bound, slot.params, execution);
        run.padded = [interpreter, widths](const Tensor& in, std::vector<Tensor>& st) {
          return interpreter->run(splitFeatures(in, widths), st);
        };
      }
      DirectionRun out = runDirection(run, parts.size() == 1 ? layerInput : concatFeatures(parts),
                                      std::move(states), lengths, direction == 1);
      for (size_t s = 0; s < out.final.size(); ++s)
        finals[s].push_back(std::move(out.final[s]));
      directionOutputs.push_back(std::move(out.output));
    }
    // Directions side by side: [T, B, H] + [T, B, H] -> [T, B, 2H].
    Tensor layerOutput = directionOutputs[0];
    if (directions_ == 2) {
      const int64_t h = directionOutputs[0].dim(2);
      layerOutput = Tensor({steps, batch, 2 * h});
      for (int64_t r = 0; r < steps * batch; ++r)
        for (int d = 0; d < 2; ++d)
          std::memcpy(row(layerOutput, r) + d * h, row(directionOutputs[d], r),
                      static_cast<size_t>(h) * sizeof(float));
    }
    if (options_.training && options_.dropout > 0 && layer + 1 < numLayers_)
      dropoutBetweenLayers(layerOutput, options_.dropout, options_.seed, layer);
    layerInput = std::move(layerOutput);
  }

  result.output = options_.batchFirst ? swapLeadingDims(layerInput) : std::move(layerInput);
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
      throw UserError(fmt::format("side input '{}' has shape {}, expected {} (rank 3)", name,
                                  tensor.shapeString(), layout));
    Tensor t = options_.batchFirst ? swapLeadingDims(tensor) : tensor;
    if (t.dim(0) != steps || t.dim(1) != batch)
      throw UserError(fmt::format("side input '{}' has shape {}, but the input has T = {} and "
                                  "B = {} ({})",
                                  name, tensor.shapeString(), steps, batch, layout));
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
  return codegen::columnsOf(value);
}

int64_t LayerProgram::stateSize(const std::string& state) const {
  const ir::Value* value = slots_.at(0).bound->findArgument(state);
  RNNC_INTERNAL_CHECK(value && value->argKind == ir::ArgKind::State, "no state " + state);
  return codegen::columnsOf(value);
}

LayerResult runLayers(const ir::Cell& cell, const LayerRequest& request,
                      const LayerOptions& options) {
  RNNC_INTERNAL_CHECK(request.weights, "no weights given");
  return LayerProgram::build(cell, *request.weights, request.weightsSource, options)
      ->run(request.input, request.initialStates, request.lengths, request.sideInputs);
}

} // namespace rnnc

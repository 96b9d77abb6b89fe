#include "runtime/LayerRunner.h"

#include "ir/Error.h"
#include "runtime/Weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

namespace rnnc {
namespace {

// Runs a bound cell over [T, B, F] inputs, updating [B, F] states: the JIT or the interpreter.
using Executor =
    std::function<Tensor(const std::vector<Tensor>& inputs, std::vector<Tensor>& states)>;

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

// One direction of one layer over the whole batch. `lengths` empty: every sequence has T steps.
struct DirectionRun {
  Tensor output;             // [T, B, H], zero past each length
  std::vector<Tensor> final; // per state, [B, F]
};

DirectionRun runDirection(const Executor& run, const Tensor& input, std::vector<Tensor> states,
                          const std::vector<int64_t>& lengths, bool reverse) {
  const int64_t steps = input.dim(0), batch = input.dim(1), features = input.dim(2);
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

  for (Tensor& state : states) { // into sorted order
    Tensor sorted(state.shape());
    for (int64_t i = 0; i < batch; ++i)
      std::memcpy(row(sorted, i), row(state, order[i]),
                  static_cast<size_t>(state.dim(1)) * sizeof(float));
    state = std::move(sorted);
  }

  DirectionRun result;
  for (int64_t t0 = 0; t0 < steps && batchSizes[t0] > 0;) {
    const int64_t active = batchSizes[t0];
    int64_t t1 = t0;
    while (t1 < steps && batchSizes[t1] == active)
      ++t1;
    // This segment's inputs and the active rows of the states, contiguous.
    Tensor segment({t1 - t0, active, features});
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t i = 0; i < active; ++i)
        std::memcpy(row(segment, (t - t0) * active + i),
                    row(input, sourceStep(t, i) * batch + order[i]),
                    static_cast<size_t>(features) * sizeof(float));
    std::vector<Tensor> activeStates;
    for (const Tensor& state : states)
      activeStates.emplace_back(TensorShape{active, state.dim(1)},
                                std::vector<float>(state.data(), row(state, active)));
    Tensor out = run({segment}, activeStates);
    for (size_t s = 0; s < states.size(); ++s)
      std::copy(activeStates[s].data(), activeStates[s].data() + activeStates[s].numel(),
                states[s].data());
    if (result.output.numel() == 0)
      result.output = Tensor({steps, batch, out.dim(2)});
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t i = 0; i < active; ++i)
        std::memcpy(row(result.output, sourceStep(t, i) * batch + order[i]),
                    row(out, (t - t0) * active + i),
                    static_cast<size_t>(out.dim(2)) * sizeof(float));
    t0 = t1;
  }
  for (Tensor& state : states) { // back to the caller's order
    Tensor unsorted(state.shape());
    for (int64_t i = 0; i < batch; ++i)
      std::memcpy(row(unsorted, order[i]), row(state, i),
                  static_cast<size_t>(state.dim(1)) * sizeof(float));
    result.final.push_back(std::move(unsorted));
  }
  return result;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Dropout on a layer's output before the next layer: zero with probability p, else scaled by
// 1 / (1 - p); the mask is a pure function of (seed, layer, element).
void dropoutBetweenLayers(Tensor& t, double p, uint64_t seed, int layer) {
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint64_t h = splitmix64(splitmix64(seed ^ (static_cast<uint64_t>(layer) << 40)) ^
                            static_cast<uint64_t>(i));
    double u = static_cast<double>(h >> 11) * 0x1.0p-53;
    t.data()[i] = u < p ? 0.0f : t.data()[i] * scale;
  }
}

std::vector<int64_t> checkedLengths(const LayerRequest& request, int64_t steps, int64_t batch) {
  if (!request.lengths)
    return std::vector<int64_t>(static_cast<size_t>(batch), steps);
  const Int64Array& lengths = *request.lengths;
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

} // namespace

LayerResult runLayers(const ir::Cell& cell, const LayerRequest& request,
                      const LayerOptions& options) {
  RNNC_INTERNAL_CHECK(request.weights, "no weights given");
  if (cell.inputs.size() != 1)
    throw UserError(fmt::format("cell '{}' has {} inputs; layers stack cells with one input",
                                cell.name, cell.inputs.size()));
  const std::string inputLayout = options.batchFirst ? "[B, T, input_size]" : "[T, B, input_size]";
  if (request.input.rank() != 3)
    throw UserError(fmt::format("input has shape {}, expected {} (rank 3)",
                                request.input.shapeString(), inputLayout));
  Tensor input = options.batchFirst ? swapLeadingDims(request.input) : request.input;
  const int64_t steps = input.dim(0), batch = input.dim(1);
  if (steps < 1 || batch < 1)
    throw UserError(
        fmt::format("input has shape {}: T and B must be at least 1", request.input.shapeString()));

  WeightLayout layout = inferWeightLayout(cell, *request.weights, request.weightsSource);
  if (options.numLayers && *options.numLayers != layout.numLayers)
    throw UserError(fmt::format("{} holds {} layer(s) of cell '{}', but {} were asked for",
                                request.weightsSource, layout.numLayers, cell.name,
                                *options.numLayers));
  if (options.bidirectional && *options.bidirectional != layout.bidirectional)
    throw UserError(fmt::format("{} holds {} weights, but a {} layer was asked for",
                                request.weightsSource,
                                layout.bidirectional ? "bidirectional (_reverse)" : "one-direction",
                                *options.bidirectional ? "bidirectional" : "one-direction"));
  const int directions = layout.bidirectional ? 2 : 1;
  const int64_t slots = static_cast<int64_t>(layout.numLayers) * directions;
  std::vector<int64_t> lengths = checkedLengths(request, steps, batch);

  for (const auto& [name, tensor] : request.initialStates) {
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

  LayerResult result;
  result.numLayers = layout.numLayers;
  result.bidirectional = layout.bidirectional;
  std::vector<std::vector<Tensor>> finals(cell.states.size()); // per state, per slot
  Tensor layerInput = std::move(input);
  for (int layer = 0; layer < layout.numLayers; ++layer) {
    std::vector<Tensor> directionOutputs;
    for (int direction = 0; direction < directions; ++direction) {
      const int64_t slot = layer * directions + direction;
      std::string where = fmt::format("layer {}{}", layer, direction ? " (reverse)" : "");
      auto params =
          collectParameters(cell, *request.weights, request.weightsSource, layer, direction == 1);
      std::vector<ShapeObservation> observations;
      for (size_t i = 0; i < params.size(); ++i)
        observations.push_back(
            {cell.params[i].get(), params[i].second->shape(),
             fmt::format("{}: tensor '{}'", request.weightsSource, params[i].first)});
      observations.push_back(
          {cell.inputs[0].get(),
           {batch, layerInput.dim(2)},
           layer == 0 ? std::string("input")
                      : fmt::format("the input of {} (the output of layer {})", where, layer - 1),
           {{"T", steps}}});
      std::vector<Tensor> states;
      for (const auto& state : cell.states) {
        auto it = request.initialStates.find(state->name);
        if (it == request.initialStates.end())
          continue;
        const Tensor& all = it->second;
        Tensor slice({batch, all.dim(2)},
                     std::vector<float>(row(all, slot * batch), row(all, (slot + 1) * batch)));
        observations.push_back({state.get(),
                                slice.shape(),
                                fmt::format("initial state '{}'", state->name),
                                {{"num_layers * num_directions", slots}}});
      }
      ir::SizeMap given = cell.sizes; // a cell may come with sizes bound already
      given.insert(options.sizes.begin(), options.sizes.end());
      given[ir::kBatchSymbol] = batch;
      ir::SizeMap sizes = inferSizes(cell, observations, given);
      sizes.erase(ir::kBatchSymbol);
      for (const auto& name : cell.sizeNames)
        if (!sizes.count(name))
          throw UserError(fmt::format("size '{}' of cell '{}' appears in no tensor given; pass "
                                      "it with --size {}=VALUE",
                                      name, cell.name, name));
      std::shared_ptr<ir::Cell> bound = cell.clone();
      bound->bindSizes(sizes);

      for (const auto& state : bound->states) {
        auto it = request.initialStates.find(state->name);
        int64_t features = *state->shape[1].evaluate(sizes);
        states.push_back(it == request.initialStates.end()
                             ? Tensor({batch, features})
                             : Tensor({batch, features},
                                      std::vector<float>(row(it->second, slot * batch),
                                                         row(it->second, (slot + 1) * batch))));
      }
      std::vector<Tensor> paramTensors;
      for (const auto& [name, tensor] : params)
        paramTensors.push_back(*tensor);
      Executor run;
      ExecutionOptions execution{options.training, options.seed + static_cast<uint64_t>(slot)};
      bool interpret = options.engine == Engine::Interpreter;
      for (const ir::Block* block : {&bound->pre, &bound->step})
        for (const auto& instr : *block)
          interpret |= options.training && instr->op == ir::Op::Dropout;
      if (interpret) {
        auto interpreter = std::make_shared<Interpreter>(*bound, paramTensors, execution);
        run = [interpreter, bound](const std::vector<Tensor>& in, std::vector<Tensor>& st) {
          return interpreter->run(in, st);
        };
      } else {
        auto compiled = CompiledCell::compile(*bound, options.compile);
        run = [compiled, paramTensors](const std::vector<Tensor>& in, std::vector<Tensor>& st) {
          return compiled->run(paramTensors, in, st);
        };
      }
      DirectionRun out = runDirection(run, layerInput, std::move(states), lengths, direction == 1);
      for (size_t s = 0; s < out.final.size(); ++s)
        finals[s].push_back(std::move(out.final[s]));
      directionOutputs.push_back(std::move(out.output));
    }
    // Directions side by side: [T, B, H] + [T, B, H] -> [T, B, 2H].
    Tensor layerOutput = directionOutputs[0];
    if (directions == 2) {
      const int64_t h = directionOutputs[0].dim(2);
      layerOutput = Tensor({steps, batch, 2 * h});
      for (int64_t r = 0; r < steps * batch; ++r)
        for (int d = 0; d < 2; ++d)
          std::memcpy(row(layerOutput, r) + d * h, row(directionOutputs[d], r),
                      static_cast<size_t>(h) * sizeof(float));
    }
    if (options.training && options.dropout > 0 && layer + 1 < layout.numLayers)
      dropoutBetweenLayers(layerOutput, options.dropout, options.seed, layer);
    layerInput = std::move(layerOutput);
  }

  result.output = options.batchFirst ? swapLeadingDims(layerInput) : std::move(layerInput);
  for (size_t s = 0; s < cell.states.size(); ++s) {
    const int64_t features = finals[s][0].dim(1);
    Tensor all({slots, batch, features});
    for (int64_t slot = 0; slot < slots; ++slot)
      std::copy(finals[s][slot].data(), finals[s][slot].data() + finals[s][slot].numel(),
                row(all, slot * batch));
    result.finalStates[cell.states[s]->name] = std::move(all);
  }
  return result;
}

} // namespace rnnc

#include "runtime/layers/Gradients.h"
#include "runtime/layers/ParameterChain.h"

#include "codegen/WeightType.h"
#include "ir/Error.h"
#include "passes/Autodiff.h"
#include "runtime/exec/Gemm.h"
#include "runtime/exec/WeightPacking.h"
#include "runtime/threads/ThreadGovernor.h"
#include "runtime/threads/ThreadTeam.h"

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>

namespace rnnc {
namespace {

int64_t constantOf(const ir::Dim& d) {
  RNNC_INTERNAL_CHECK(d.isConstant(), "unbound size in a training layout: " + d.str());
  return d.constantValue();
}

// The threads a run on `threads` (0: automatic) uses, as the runs choose them.
int resolvedThreads(int threads) {
  return threads > 0 ? threads : ThreadGovernor::shared().threadsFor(defaultThreadCount());
}

// part(begin, end) for parts of [0, count) on `threads` threads of a pooled team: the runner's
// copies of tens of megabytes between the kernels (the layer's output out of the training
// forward's, the states entering each step), which on one thread left the other core idle for
// a few percent of a 2-thread training step.
void inParts(int threads, int64_t count, const std::function<void(int64_t, int64_t)>& part) {
  if (threads <= 1 || count < threads)
    return part(0, count);
  TeamPool::Lease lease = TeamPool::shared().acquire(threads);
  lease.team->run([&](int t) { part(count * t / threads, count * (t + 1) / threads); });
}

// The value of each state entering every step of one direction, [T, B, F] per state: what the
// step before left it at (`values` columns `offsets`), the initial state at each sequence's
// first step; the rows past a sequence's length are not read.
std::vector<Tensor> statesEnteringEachStep(const TrainingTape::Slot& kept,
                                           const std::vector<ir::Dim>& offsets,
                                           const std::vector<int64_t>& lengths, bool reverse,
                                           int threads) {
  const Tensor& values = kept.values;
  const int64_t steps = values.dim(0), batch = values.dim(1);
  std::vector<Tensor> entering;
  for (size_t k = 0; k < offsets.size(); ++k) {
    const Tensor& initial = kept.initialStates[k];
    const int64_t width = initial.dim(1);
    const size_t bytes = static_cast<size_t>(width) * sizeof(float);
    const int64_t offset = constantOf(offsets[k]);
    Tensor all = Tensor::uninitialized({steps, batch, width});
    inParts(threads, steps, [&](int64_t firstStep, int64_t endStep) {
      for (int64_t t = firstStep; t < endStep; ++t)
        for (int64_t b = 0; b < batch; ++b) {
          const int64_t length = lengths[static_cast<size_t>(b)];
          float* to = row(all, t * batch + b);
          if (t >= length) // past the sequence: never read
            std::memset(to, 0, bytes);
          else if (t == (reverse ? length - 1 : 0))
            std::memcpy(to, row(initial, b), bytes);
          else
            std::memcpy(to, row(values, (reverse ? t + 1 : t - 1) * batch + b) + offset, bytes);
        }
    });
    entering.push_back(std::move(all));
  }
  return entering;
}

} // namespace

// The derived cells of one layer and direction, ready to run.
struct GradientProgram::Slot {
  passes::BackwardCell backward;
  passes::TrainingForward forward; // its output's layout: where each state and kept value is
  std::shared_ptr<const CompiledCell> forwardCode, backwardCode; // null: the interpreter
  std::shared_ptr<const CompiledCell::Prepared> forwardPrepared, backwardPrepared;
  std::shared_ptr<const Interpreter> forwardInterpreter, backwardInterpreter;

  // Scratch memory of the compiled code, kept between calls.
  std::shared_ptr<WorkspacePool> forwardWorkspaces = std::make_shared<WorkspacePool>();
  std::shared_ptr<WorkspacePool> backwardWorkspaces = std::make_shared<WorkspacePool>();

  // The seed of the training forward's dropout masks: the layer runner's for this slot.
  uint64_t maskSeed = 0;
  // The products' weights: the interpreter computes them as the generated code does.
  codegen::WeightType weights = codegen::WeightType::F32;

  // Mixed precision in fp16: the products' weights as the forward's tiles read them (rounded),
  // by parameter name, for the input gradients' products dx += g W, so that they are the
  // gradients of the forward that ran. Empty otherwise (bf16's products round their operands
  // themselves: GemmPrecision::Bf16).
  std::map<std::string, Tensor> reducedWeights;

  // The training forward drawing its masks from `seed` (maskSeed, or a call's own: the
  // interpreter's is then made for the call, over the slot's parameters).
  Executor forwardRun(int threads, uint64_t seed, const std::vector<Tensor>& params,
                      bool training) const {
    if (forwardCode)
      return jitExecutor(forwardCode, forwardPrepared, threads, forwardWorkspaces, seed);
    return interpreterExecutor(
        seed == maskSeed ? forwardInterpreter
                         : std::make_shared<Interpreter>(
                               *forward.cell, params, withProductsAs(weights, {training, seed})));
  }
  // The backward cell's inputs `kept.<k>` (its last ones), where the training forward wrote
  // them among its outputs ([T, B, W] `values`).
  CellInputs keptValues(const Tensor& values) const {
    const auto& inputs = backward.cell->inputs;
    const size_t first = inputs.size() - backward.kept.size();
    CellInputs kept;
    for (size_t k = 0; k < backward.kept.size(); ++k)
      kept.push_back(columnsOf(values, {ir::columnsOf(inputs[first + k].get())},
                               constantOf(forward.keptOffsets[k]))[0]);
    return kept;
  }
  Executor backwardRun(int threads) const {
    return backwardCode ? jitExecutor(backwardCode, backwardPrepared, threads, backwardWorkspaces)
                        : interpreterExecutor(backwardInterpreter);
  }
};

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRows = Eigen::Map<const RowMajor>;

// A row-major Eigen block (a map or columns of one) as the GEMM's view.
template <class M> MatrixView viewOf(const M& m) {
  return MatrixView::rowMajor(m.data(), m.rows(), m.cols(), m.outerStride());
}

// to += columns [offset, offset + width) of `from` ([T, B, F]; `to` [T, B, width]).
void addColumns(Tensor& to, const Tensor& from, int64_t offset, int64_t width) {
  const int64_t rows = from.dim(0) * from.dim(1);
  RNNC_INTERNAL_CHECK(to.numel() == rows * width, "gradient shapes differ");
  for (int64_t r = 0; r < rows; ++r) {
    float* out = to.data() + r * width;
    const float* in = row(from, r) + offset;
    for (int64_t c = 0; c < width; ++c)
      out[c] += in[c];
  }
}

// C += A B (or A B^T).
template <class A, class B>
void accumulateRowProduct(Eigen::Map<RowMajor>& c, const A& a, const B& b, bool transposeB,
                          int threads, const std::string& targetCpu, GemmPrecision precision) {
  const MatrixView vb = viewOf(b);
  gemmAccumulate(viewOf(a), transposeB ? vb.transposed() : vb, c.data(), c.outerStride(), threads,
                 targetCpu, precision);
}

// The index of the parameter called `name` in a slot's cell.
size_t paramIndex(const LayerProgram::Slot& slot, const std::string& name) {
  for (size_t p = 0; p < slot.bound->params.size(); ++p)
    if (slot.bound->params[p]->name == name)
      return p;
  RNNC_INTERNAL_CHECK(false, "no parameter " + name);
  return 0;
}

} // namespace

std::string initialStateGradientName(const std::string& state) {
  return state == "h" || state == "c" ? state + "0" : state;
}

int64_t TrainingTape::bytes() const {
  // x: layer 0's inputs (the caller's input and side inputs); y: the last layer's outputs.
  std::set<const Tensor*> counted;
  if (!slots.empty())
    for (const auto& input : slots[0].inputs)
      counted.insert(input.get());
  const size_t lastLayer = forward.bidirectional ? 2 : 1;
  int64_t floats = forward.output.numel();
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& slot = slots[i];
    for (const auto& input : slot.inputs)
      if (counted.insert(input.get()).second)
        floats += input->numel();
    floats += slot.values.numel();
    if (i + lastLayer >= slots.size() && slot.values.rank() == 3)
      floats -= slot.values.dim(0) * slot.values.dim(1) * slot.outputWidth;
  }
  return floats * static_cast<int64_t>(sizeof(float));
}

namespace {

// `weight` rounded to fp16 as the packing rounds it (to nearest even), in fp32.
Tensor fp16Rounded(const Tensor& weight) {
  Tensor reduced = weight;
  for (float& v : reduced.values())
    v = static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(halfBits(v)));
  return reduced;
}

bool isDerived(const passes::BackwardCell& backward, const std::string& weight) {
  return std::any_of(backward.derivedWeights.begin(), backward.derivedWeights.end(),
                     [&](const passes::DerivedWeight& derived) { return derived.name == weight; });
}

// The layer program binds every slot's sizes and parameters; the cells that run are derived,
// so its own forward is not compiled.
LayerOptions bindingOnly(const LayerOptions& options) {
  LayerOptions bindOnly = options;
  bindOnly.engine = Engine::Interpreter;
  // The interpreter binds in fp32; the training cells compile with the options' weights.
  bindOnly.compile.weights = codegen::WeightType::F32;
  return bindOnly;
}

// The backward names each gradient: "input", an initial state's (h0, c0, or the state's name),
// a parameter's (as the weights name it) and a side input's own name. A side input called as
// one of the others would have two gradients under one name: refused, naming both.
void checkGradientNames(const LayerProgram& layers) {
  std::map<std::string, std::string> taken{{"input", "the input's"}};
  for (const auto& state : layers.cell().states)
    taken.emplace(initialStateGradientName(state->name), "initial state " + state->name + "'s");
  for (const LayerProgram::Slot& slot : layers.slots())
    for (const std::string& param : slot.paramNames)
      taken.emplace(param, "parameter " + param + "'s");
  for (const std::string& side : layers.sideInputNames())
    if (auto it = taken.find(side); it != taken.end())
      throw UserError(fmt::format("cell '{}': side input '{}' has the name of {} gradient; "
                                  "rename the input to train the cell",
                                  layers.cell().name, side, it->second));
}

} // namespace

std::shared_ptr<const GradientProgram> GradientProgram::build(const ir::Cell& cell,
                                                              const TensorMap& weights,
                                                              const std::string& weightsSource,
                                                              const LayerOptions& options,
                                                              passes::ForwardValues forwardValues) {
  return build(LayerProgram::build(cell, weights, weightsSource, bindingOnly(options)), options,
               forwardValues);
}

std::shared_ptr<const GradientProgram>
GradientProgram::build(const ir::Cell& cell, TensorMap&& weights, const std::string& weightsSource,
                       const LayerOptions& options, passes::ForwardValues forwardValues) {
  return build(LayerProgram::build(cell, std::move(weights), weightsSource, bindingOnly(options)),
               options, forwardValues);
}

std::shared_ptr<const GradientProgram>
GradientProgram::build(std::shared_ptr<const LayerProgram> layers, const LayerOptions& options,
                       passes::ForwardValues forwardValues) {
  const ir::Cell& cell = layers->cell();
  if (isGpuEngine(options.engine))
    throw UserError(fmt::format("training runs on the CPU (the JIT or the interpreter), not on {} "
                                "yet",
                                engineName(options.engine)));
  // Mixed precision: bf16 or fp16 weights in the training forward's and the backward step's
  // products (the backward's through the same rounded weights, so it is the gradient of the
  // forward that ran), fp32 states, gradients and weight updates. int8's rounding has no useful
  // gradient: quantize a model trained in fp32 (or bf16) instead.
  if (options.compile.weights == codegen::WeightType::I8)
    throw UserError("int8 weights are for inference: train in fp32, bf16 or fp16, then run the "
                    "trained weights as int8");
  // Named by the user's cell, before the JIT's storage plan would name its training forward.
  checkReducedWeightsChangeSomething(cell, options.compile.weights);
  checkGradientNames(*layers);
  // In training, a layer program's cells have no dropout left (passes/TrainingDropout.h: masks
  // drawn per row, or for parameters alone, a mask parameter per run).
  if (options.training)
    for (const LayerProgram::Slot& slot : layers->slots())
      RNNC_INTERNAL_CHECK(!ir::containsOp(*slot.bound, ir::Op::Dropout),
                          "a training layer with a dropout left in cell '" + cell.name + "'");
  auto program = std::shared_ptr<GradientProgram>(new GradientProgram);
  program->options_ = options;
  program->program_ = std::move(layers);
  std::vector<std::shared_ptr<Slot>> slots;
  for (const LayerProgram::Slot& slot : program->program_->slots()) {
    auto s = std::make_shared<Slot>();
    // In training, the bound cell's dropouts are masks already (passes/TrainingDropout.h),
    // which the backward reads as the forward kept them.
    s->backward = passes::deriveBackward(*slot.bound, forwardValues);
    RNNC_INTERNAL_CHECK(!ir::containsOp(*s->backward.cell, ir::Op::DropoutMask),
                        "a backward step that draws dropout masks again");
    s->forward = passes::trainingForward(*slot.bound, s->backward);
    s->maskSeed = options.maskSeedOf(static_cast<int64_t>(slots.size()));
    s->weights = options.compile.weights;
    if (options.compile.weights == codegen::WeightType::F16)
      for (const passes::GradientSegment& seg : s->backward.segments)
        if ((seg.kind == passes::GradientSegment::Kind::InputByLinear ||
             seg.kind == passes::GradientSegment::Kind::InputByMatMul) &&
            !s->reducedWeights.count(seg.weight) && !isDerived(s->backward, seg.weight))
          s->reducedWeights.emplace(seg.weight,
                                    fp16Rounded(slot.params[paramIndex(slot, seg.weight)]));
    if (options.engine != Engine::Jit) {
      s->forwardInterpreter = std::make_shared<Interpreter>(
          *s->forward.cell, slot.params,
          withProductsAs(s->weights, {options.training, s->maskSeed}));
      s->backwardInterpreter =
          std::make_shared<Interpreter>(*s->backward.cell, slot.params, withProductsAs(s->weights));
    }
    slots.push_back(std::move(s));
  }
  if (options.engine == Engine::Jit) {
    // Every slot's training forward and backward, compiled side by side.
    std::vector<const ir::Cell*> cells;
    for (const auto& s : slots) {
      cells.push_back(s->forward.cell.get());
      cells.push_back(s->backward.cell.get());
    }
    std::vector<std::shared_ptr<CompiledCell>> code =
        CompiledCell::compileAll(cells, options.compile);
    const std::vector<LayerProgram::Slot>& layerSlots = program->program_->slots();
    for (size_t i = 0; i < slots.size(); ++i) {
      Slot& s = *slots[i];
      s.forwardCode = code[2 * i];
      s.forwardPrepared = s.forwardCode->prepare(layerSlots[i].params, options.threads);
      s.backwardCode = code[2 * i + 1];
      s.backwardPrepared = s.backwardCode->prepare(layerSlots[i].params, options.threads);
    }
  }
  program->slots_.assign(slots.begin(), slots.end());
  return program;
}

TrainingTape GradientProgram::forward(const Tensor& input,
                                      const std::map<std::string, Tensor>& initialStates,
                                      const std::optional<Int64Array>& lengths,
                                      const std::map<std::string, Tensor>& sideInputs,
                                      std::optional<uint64_t> seed) const {
  return forward(Tensor(input), initialStates, lengths, sideInputs, seed);
}

bool GradientProgram::drawsMasksAtBuild() const {
  for (const LayerProgram::Slot& slot : program_->slots())
    if (slot.parameterMasks)
      return true;
  return false;
}

TrainingTape GradientProgram::forward(Tensor&& input,
                                      const std::map<std::string, Tensor>& initialStates,
                                      const std::optional<Int64Array>& lengths,
                                      const std::map<std::string, Tensor>& sideInputs,
                                      std::optional<uint64_t> seed) const {
  TrainingTape tape;
  tape.seed = seed.value_or(options_.seed);
  if (tape.seed != options_.seed && drawsMasksAtBuild())
    throw UserError(fmt::format(
        "cell '{}' drops parameters (a weight's dropout), whose masks were drawn from seed {} "
        "when the layer was built: build it again for seed {}",
        program_->cell().name, options_.seed, tape.seed));
  LayerOptions masks = options_; // each slot's masks drawn from the call's seed
  masks.seed = tape.seed;
  tape.slots.resize(slots_.size());
  const int threads = options_.threads;
  // The layer runner (checks, sorting, directions, dropout between layers, batch_first) with
  // each slot run by its training cell, keeping its inputs, initial states and outputs.
  auto trainingRun = [&](int64_t index, const std::vector<std::shared_ptr<const Tensor>>& inputs,
                         int64_t steps, int64_t batch, std::vector<Tensor> states,
                         const std::vector<int64_t>& runLengths, bool reverse) {
    const Slot& s = *slots_[static_cast<size_t>(index)];
    TrainingTape::Slot& kept = tape.slots[static_cast<size_t>(index)];
    kept.inputs = inputs;
    kept.initialStates = states;
    CellInputs rows;
    for (const auto& input : inputs)
      rows.push_back(InputRows::of(*input));
    DirectionRun out = runDirection(
        s.forwardRun(threads, masks.maskSeedOf(index),
                     program_->slots()[static_cast<size_t>(index)].params, options_.training),
        rows, steps, batch, std::move(states), runLengths, reverse);
    // Kept whole; the layer's output copied out of its first columns.
    kept.outputWidth = ir::columnsOf(program_->slots()[static_cast<size_t>(index)].bound->output);
    kept.values = std::move(out.output);
    out.output = Tensor::uninitialized({steps, batch, kept.outputWidth});
    const size_t rowBytes = static_cast<size_t>(kept.outputWidth) * sizeof(float);
    inParts(resolvedThreads(threads), steps * batch, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        std::memcpy(row(out.output, r), row(kept.values, r), rowBytes);
    });
    return out;
  };
  tape.forward =
      program_->run(std::move(input), initialStates, lengths, sideInputs, trainingRun, tape.seed);
  tape.outputShape = tape.forward.output.shape();
  const Tensor& first = *tape.slots[0].inputs.at(0);
  tape.lengths = checkedLengths(lengths, first.dim(0), first.dim(1));
  return tape;
}

void GradientProgram::backwardInto(const TrainingTape& tape, const GradientInputs& given,
                                   TensorMap& grads) const {
  // The weight gradients' GEMMs in the layer's target's code, as its kernels.
  const std::string& targetCpu = options_.compile.targetCpu;
  const codegen::WeightType weightType = options_.compile.weights;
  // Mixed precision in bf16: the input and weight gradients' products in bf16 too, as the
  // forward's and the backward step's (fp16 rounds the weights alone: dx's are rounded already).
  const GemmPrecision gemmPrecision =
      weightType == codegen::WeightType::BF16 ? GemmPrecision::Bf16 : GemmPrecision::F32;
  const ir::Cell& cell = program_->cell();
  const int directions = program_->numDirections(), layers = program_->numLayers();
  const int threads = options_.threads;
  const Tensor& firstInput = *tape.slots.at(0).inputs.at(0);
  const int64_t steps = firstInput.dim(0), batch = firstInput.dim(1);
  const int64_t slotCount = static_cast<int64_t>(slots_.size());
  // The weight and input gradients' products: an automatic count (0) as the runs choose it.
  const int gemmThreads = resolvedThreads(threads);

  // dLoss/d(this layer's output) in [T, B, D*H]: the given one where it is already laid out so
  // (checked), else in `ownGradient`; then each layer's input gradient, for the layer below.
  const TensorShape& outputShape = tape.outputShape;
  Tensor ownGradient;
  const Tensor* gradLayerOutput = &ownGradient;
  if (given.output.rank() == 0) { // none given
    ownGradient = Tensor({steps, batch, outputShape[2]});
  } else {
    if (given.output.shape() != outputShape)
      throw UserError(fmt::format("{} has shape {}, expected the output's {}",
                                  describeTensor("the output gradient", given.output),
                                  given.output.shapeString(), shapeToString(outputShape)));
    if (options_.batchFirst)
      ownGradient = swapLeadingDims(given.output);
    else
      gradLayerOutput = &given.output;
  }
  for (const auto& [name, tensor] : given.finalStates) {
    auto it = tape.forward.finalStates.find(name);
    if (it == tape.forward.finalStates.end())
      throw UserError(fmt::format("a final-state gradient is given for '{}', but cell '{}' has "
                                  "no state of that name",
                                  name, cell.name));
    if (tensor.shape() != it->second.shape())
      throw UserError(
          fmt::format("{} has shape {}, expected {}",
                      describeTensor(fmt::format("the gradient of final state '{}'", name), tensor),
                      tensor.shapeString(), it->second.shapeString()));
  }

  for (const auto& state : cell.states)
    grads[initialStateGradientName(state->name)] =
        Tensor({slotCount, batch, program_->stateSize(state->name)});

  for (int layer = layers - 1; layer >= 0; --layer) {
    Tensor gradLayerInput;
    for (int direction = 0; direction < directions; ++direction) {
      const int64_t index = layer * directions + direction;
      const Slot& s = *slots_[static_cast<size_t>(index)];
      const TrainingTape::Slot& kept = tape.slots[static_cast<size_t>(index)];
      const LayerProgram::Slot& slot = program_->slots()[static_cast<size_t>(index)];
      const int64_t outWidth = ir::columnsOf(slot.bound->output);

      // The backward step's inputs, where they are: the cell's inputs, the states entering
      // each step and the kept forward values (columns of the forward's outputs), the output
      // gradient of this direction (columns of the layer's).
      CellInputs inputs;
      for (const auto& in : kept.inputs)
        inputs.push_back(InputRows::of(*in));
      const std::vector<Tensor> entering = statesEnteringEachStep(
          kept, s.forward.stateOffsets, tape.lengths, direction == 1, gemmThreads);
      for (const Tensor& state : entering)
        inputs.push_back(InputRows::of(state));
      inputs.push_back(columnsOf(*gradLayerOutput, {outWidth}, direction * outWidth)[0]);
      for (const InputRows& value : s.keptValues(kept.values))
        inputs.push_back(value);
      // Each input of the backward cell by name (the cell's inputs, then its states).
      std::map<std::string, InputRows> inputNamed;
      {
        size_t at = 0;
        for (const auto& input : slot.bound->inputs)
          inputNamed[input->name] = inputs[at++];
        for (const auto& state : slot.bound->states)
          inputNamed[state->name] = inputs[at++];
      }
      std::vector<Tensor> gradStates;
      for (const auto& state : slot.bound->states) {
        int64_t features = ir::columnsOf(state.get());
        auto it = given.finalStates.find(state->name);
        gradStates.push_back(
            it == given.finalStates.end()
                ? Tensor({batch, features})
                : Tensor({batch, features},
                         std::vector<float>(row(it->second, index * batch),
                                            row(it->second, (index + 1) * batch))));
      }
      // Backwards in time: from each sequence's end for the forward direction, from its start
      // for the reverse one.
      DirectionRun back = runDirection(s.backwardRun(threads), inputs, steps, batch,
                                       std::move(gradStates), tape.lengths, direction == 0);
      for (size_t k = 0; k < slot.bound->states.size(); ++k) {
        Tensor& all = grads.at(initialStateGradientName(slot.bound->states[k]->name));
        std::memcpy(row(all, index * batch), back.final[k].data(),
                    static_cast<size_t>(back.final[k].numel()) * sizeof(float));
      }

      // The segments of the per-step output: input gradients, parameter gradient factors.
      const Tensor& o = back.output; // [T, B, W], zero past each length
      ConstRows rows(o.data(), steps * batch, o.dim(2));
      // dLoss/d(an input): the layer's (its first), or a side input's, which every layer reads.
      auto inputGradient = [&](const std::string& name, int64_t width) -> Tensor& {
        Tensor& t = name == slot.bound->inputs[0]->name ? gradLayerInput : grads[name];
        if (t.rank() != 3)
          t = Tensor({steps, batch, width});
        return t;
      };
      // The parameter gradients that read the same columns of the output, G (a layer's dW_ih,
      // dW_hh and both biases' column sums of G), as one product: G packed once for all.
      struct SharedColumns {
        std::vector<GemmProduct> products;
        std::vector<float*> sums; // vector weights: += G's column sums
      };
      std::map<std::pair<int64_t, int64_t>, SharedColumns> byColumns;
      // Weights made of parameters alone: their values, and their gradients until they go on to
      // the parameters, after the products.
      std::optional<ParameterChain> chain;
      if (!s.backward.derivedWeights.empty())
        chain.emplace(*slot.bound, slot.params);
      std::map<std::string, Tensor> derivedGradients;
      auto derivedPosition = [&](const std::string& name) -> std::optional<size_t> {
        for (const passes::DerivedWeight& derived : s.backward.derivedWeights)
          if (derived.name == name)
            return derived.position;
        return std::nullopt;
      };
      for (const passes::GradientSegment& seg : s.backward.segments) {
        const int64_t at = constantOf(seg.offset), width = constantOf(seg.width);
        using Kind = passes::GradientSegment::Kind;
        if (seg.kind == Kind::Input) {
          addColumns(inputGradient(seg.name, width), o, at, width);
          continue;
        }
        if (seg.kind == Kind::InputByLinear || seg.kind == Kind::InputByMatMul) {
          // dx += g W (or g W^T) for every row at once.
          const std::optional<size_t> derived = derivedPosition(seg.weight);
          const Tensor* weight = nullptr;
          Tensor reducedDerived;
          if (derived) {
            weight = &chain->value(*derived);
            if (weightType == codegen::WeightType::F16) { // (bf16's products round it)
              reducedDerived = fp16Rounded(*weight);
              weight = &reducedDerived;
            }
          } else if (auto reduced = s.reducedWeights.find(seg.weight);
                     reduced != s.reducedWeights.end()) {
            weight = &reduced->second;
          } else {
            weight = &slot.params[paramIndex(slot, seg.weight)];
          }
          ConstRows w(weight->data(), weight->shape()[0], weight->shape()[1]);
          Tensor& dx = inputGradient(seg.name, constantOf(seg.operandWidth));
          Eigen::Map<RowMajor> dX(dx.data(), steps * batch, dx.dim(2));
          auto g = rows.middleCols(at, width);
          if (seg.kind == Kind::InputByLinear)
            accumulateRowProduct(dX, g, w, /*transposeB=*/false, gemmThreads, targetCpu,
                                 gemmPrecision);
          else
            accumulateRowProduct(dX, g, w, /*transposeB=*/true, gemmThreads, targetCpu,
                                 gemmPrecision);
          continue;
        }
        Tensor* gradient = nullptr;
        const Tensor* weight = nullptr;
        if (const std::optional<size_t> derived = derivedPosition(seg.name)) {
          weight = &chain->value(*derived);
          gradient = &derivedGradients.try_emplace(seg.name, weight->shape()).first->second;
        } else {
          // The parameter's name in the weights; none for a bias a bias-free file lacks.
          const size_t p = paramIndex(slot, seg.name);
          if (!slot.inWeights[p])
            continue;
          weight = &slot.params[p];
          gradient = &grads.try_emplace(slot.paramNames[p], weight->shape()).first->second;
        }
        Eigen::Map<RowMajor> dW(gradient->data(), weight->shape()[0],
                                weight->rank() == 2 ? weight->shape()[1] : 1);
        auto g = rows.middleCols(at, width);
        if (seg.kind == Kind::VectorWeight) { // G's column sums
          byColumns[{at, width}].sums.push_back(dW.data());
          continue;
        }
        // The operand: an input of the backward cell as given (rows past a sequence's length
        // meet zero gradients), or columns of its output.
        const InputRows operand =
            seg.operandInput.empty()
                ? InputRows{o.data() + constantOf(seg.operandOffset), steps * batch,
                            constantOf(seg.operandWidth), o.dim(2)}
                : inputNamed.at(seg.operandInput);
        const MatrixView a = MatrixView::rowMajor(operand.data, operand.rows,
                                                  constantOf(seg.operandWidth), operand.stride);
        if (seg.kind == Kind::LinearWeight) // dW [N, K] += G^T A: with the others on G
          byColumns[{at, width}].products.push_back({a, dW.data(), dW.outerStride()});
        else // dW [K, N] += A^T G
          gemmAccumulate(a.transposed(), viewOf(g), dW.data(), dW.outerStride(), gemmThreads,
                         targetCpu, gemmPrecision);
      }
      for (const auto& [columns, shared] : byColumns) {
        const auto [at, width] = columns;
        const MatrixView g = viewOf(rows.middleCols(at, width));
        std::vector<float> sums(shared.sums.empty() ? 0 : static_cast<size_t>(width), 0.0f);
        gemmAccumulate(g.transposed(), shared.products, gemmThreads,
                       sums.empty() ? nullptr : sums.data(), targetCpu, gemmPrecision);
        for (float* sum : shared.sums)
          for (int64_t c = 0; c < width; ++c)
            sum[c] += sums[static_cast<size_t>(c)];
      }
      // On through what made each derived weight, to the parameters it is made of.
      if (!derivedGradients.empty()) {
        std::vector<Tensor> paramGradients;
        for (const Tensor& param : slot.params)
          paramGradients.emplace_back(param.shape());
        for (const auto& [name, gradient] : derivedGradients)
          chain->backpropagate(*derivedPosition(name), gradient, paramGradients);
        for (size_t p = 0; p < slot.params.size(); ++p) {
          if (!slot.inWeights[p])
            continue;
          Tensor& total =
              grads.try_emplace(slot.paramNames[p], slot.params[p].shape()).first->second;
          for (int64_t i = 0; i < total.numel(); ++i)
            total.data()[i] += paramGradients[p].data()[i];
        }
      }
    }
    // Inputs no path of the cell reaches (whatever reads them is dead) have zero gradients.
    const TrainingTape::Slot& first = tape.slots[static_cast<size_t>(layer * directions)];
    const auto& inputs = program_->slots()[static_cast<size_t>(layer * directions)].bound->inputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor& gradient = i == 0 ? gradLayerInput : grads[inputs[i]->name];
      if (gradient.rank() != 3)
        gradient = Tensor({steps, batch, first.inputs.at(i)->dim(2)});
    }
    // Down a layer: through the dropout between layers, as the forward applied it (the
    // gradient times the mask: the same dropout applied to it, in place).
    if (layer > 0 && options_.training && options_.dropout > 0)
      dropoutBetweenLayers(gradLayerInput, options_.dropout, tape.seed, layer - 1);
    ownGradient = std::move(gradLayerInput);
    gradLayerOutput = &ownGradient;
  }
  grads["input"] = options_.batchFirst ? swapLeadingDims(ownGradient) : std::move(ownGradient);
  if (options_.batchFirst)
    for (const std::string& side : program_->sideInputNames())
      if (grads.count(side))
        grads[side] = swapLeadingDims(grads[side]);
  // Parameters no path reaches (none in a well-formed cell) still get their zero gradient
  // (try_emplace: a Tensor made only where there is none, not zeroed and dropped for each).
  for (size_t i = 0; i < program_->slots().size(); ++i) {
    const LayerProgram::Slot& slot = program_->slots()[i];
    for (size_t p = 0; p < slot.params.size(); ++p)
      if (slot.inWeights[p])
        grads.try_emplace(slot.paramNames[p], slot.params[p].shape());
  }
}

TensorMap GradientProgram::backward(const TrainingTape& tape, const GradientInputs& given) const {
  TensorMap grads;
  backwardInto(tape, given, grads);
  return grads;
}

TensorMap GradientProgram::backward(const TrainingTape& tape, const GradientInputs& given,
                                    TensorMap& parameterSums) const {
  // The sums go in as the gradients the products add to, and come out again.
  TensorMap grads;
  std::vector<std::pair<const std::string*, TensorShape>> params;
  for (const LayerProgram::Slot& slot : program_->slots())
    for (size_t p = 0; p < slot.params.size(); ++p)
      if (slot.inWeights[p])
        params.emplace_back(&slot.paramNames[p], slot.params[p].shape());
  for (const auto& [name, shape] : params) {
    auto it = parameterSums.find(*name);
    if (it == parameterSums.end())
      continue;
    if (it->second.shape() != shape)
      throw UserError(fmt::format("the sum of parameter {}'s gradients has shape {}, expected {}",
                                  *name, it->second.shapeString(), shapeToString(shape)));
    grads[*name] = std::move(it->second);
  }
  backwardInto(tape, given, grads);
  for (const auto& [name, shape] : params) {
    auto it = grads.find(*name);
    parameterSums[*name] = std::move(it->second);
    grads.erase(it);
  }
  return grads;
}

GradientResult runGradients(const ir::Cell& cell, const GradientRequest& request,
                            const LayerOptions& options) {
  RNNC_INTERNAL_CHECK(request.weights, "no weights given");
  auto program = GradientProgram::build(cell, *request.weights, request.weightsSource, options);
  TrainingTape tape =
      program->forward(request.input, request.initialStates, request.lengths, request.sideInputs);
  GradientResult result;
  result.gradients = program->backward(tape, {request.gradOutput, request.gradFinalStates});
  result.forward = std::move(tape.forward);
  return result;
}

} // namespace rnnc

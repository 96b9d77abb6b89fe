// The public C++ API (include/rnnc/rnnc.h) over the layer runner.
#include "rnnc/rnnc.h"

#include "codegen/WeightType.h"
#include "frontend/BuiltinCells.h"
#include "ir/Error.h"
#include "runtime/data/WeightFile.h"
#include "runtime/data/WeightLayouts.h"
#include "runtime/data/Weights.h"
#include "runtime/layers/Gradients.h"
#include "runtime/layers/LayerRunner.h"

#include <cstring>
#include <mutex>
#include <vector>

namespace rnnc {

struct Layer::Impl {
  std::shared_ptr<const LayerProgram> program;
  bool batchFirst = false;
  // For training, built over `program` on the first forwardTraining().
  mutable std::once_flag trainingBuilt;
  mutable std::shared_ptr<const GradientProgram> training;

  const GradientProgram& trainingProgram() const {
    std::call_once(trainingBuilt,
                   [&] { training = GradientProgram::build(program, program->options()); });
    return *training;
  }
};

struct TrainingRecord::Impl {
  TrainingTape tape;
};

struct GradientSums::Impl {
  std::mutex mutex; // backward() calls from several threads add one at a time
  TensorMap sums;
  bool broken = false; // a backward() that added into the sums failed
};

GradientSums::GradientSums() : impl_(std::make_shared<Impl>()) {}

std::map<std::string, WeightTensor> GradientSums::take() {
  TensorMap sums;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->broken)
      throw UserError("these gradient sums are incomplete: a backward() adding into them failed");
    sums.swap(impl_->sums);
  }
  std::map<std::string, WeightTensor> out;
  for (auto& [name, tensor] : sums)
    out[name] = {tensor.shape(),
                 std::vector<float>(tensor.values().begin(), tensor.values().end())};
  return out;
}

bool GradientSums::empty() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->sums.empty();
}

int64_t TrainingRecord::workspaceBytes() const {
  return impl_ ? impl_->tape.bytes() : 0;
}

namespace {

// `allWeights` is the caller's to give away: the layers take its tensors rather than copy them.
std::shared_ptr<const Layer::Impl> buildLayer(const LayerSpec& spec, TensorMap allWeights,
                                              const std::string& source) {
  TensorMap weights = spec.weightsPrefix.empty()
                          ? std::move(allWeights)
                          : selectPrefixed(allWeights, spec.weightsPrefix, source);
  auto cell = frontend::loadCell(projectedCell(spec.cell, holdsProjection(weights)));
  LayerOptions options;
  options.numLayers = spec.numLayers;
  options.bidirectional = spec.bidirectional;
  options.batchFirst = spec.batchFirst;
  options.engine = engineFor(spec.device, !spec.jit, "LayerSpec::device", "LayerSpec::jit = false");
  if (spec.threads < 0)
    throw UserError("LayerSpec::threads must be 0 (automatic) or positive, not " +
                    std::to_string(spec.threads));
  options.threads = spec.threads;
  options.compile.targetCpu = spec.targetCpu;
  options.compile.weights = codegen::parseWeightType(spec.weightsDtype);
  options.sizes = {spec.sizes.begin(), spec.sizes.end()};
  auto impl = std::make_shared<Layer::Impl>();
  impl->program = LayerProgram::build(*cell, std::move(weights), source, options);
  impl->batchFirst = spec.batchFirst;
  return impl;
}

Tensor copyIn(const float* data, TensorShape shape) {
  Tensor t(std::move(shape));
  std::memcpy(t.data(), data, static_cast<size_t>(t.numel()) * sizeof(float));
  return t;
}

void copyOut(const Tensor& t, float* to) {
  if (to)
    std::memcpy(to, t.data(), static_cast<size_t>(t.numel()) * sizeof(float));
}

} // namespace

Layer Layer::fromFile(const LayerSpec& spec, const std::string& weightsPath) {
  return Layer(buildLayer(spec, readWeightFile(weightsPath), weightsPath));
}

Layer Layer::fromWeights(const LayerSpec& spec,
                         const std::map<std::string, WeightTensor>& weights) {
  TensorMap tensors;
  for (const auto& [name, w] : weights) {
    if (numElements(w.shape) != static_cast<int64_t>(w.values.size()))
      throw UserError("weight '" + name + "' has shape " + shapeToString(w.shape) + " but " +
                      std::to_string(w.values.size()) + " values");
    tensors[name] = Tensor(w.shape, w.values);
  }
  return Layer(buildLayer(spec, std::move(tensors), "weights"));
}

int Layer::numLayers() const {
  return impl_->program->numLayers();
}
int Layer::numDirections() const {
  return impl_->program->numDirections();
}
int64_t Layer::inputSize() const {
  return impl_->program->inputSize();
}
int64_t Layer::outputSize() const {
  return impl_->program->outputSize();
}

int64_t Layer::stateSize(const std::string& state) const {
  const ir::Value* value = impl_->program->cell().findArgument(state);
  if (!value || value->argKind != ir::ArgKind::State)
    throw UserError("cell '" + impl_->program->cell().name + "' has no state '" + state + "'");
  return impl_->program->stateSize(state);
}

std::vector<std::string> Layer::sideInputNames() const {
  return impl_->program->sideInputNames();
}

int64_t Layer::sideInputSize(const std::string& name) const {
  return impl_->program->sideInputSize(name);
}

std::vector<std::string> Layer::stateNames() const {
  std::vector<std::string> names;
  for (const auto& state : impl_->program->cell().states)
    names.push_back(state->name);
  return names;
}

namespace {

// The h and c of the fixed-form calls as named buffers. A final state's buffer for a state the
// cell lacks is left unwritten, as these calls always did (a GRU's cn); an initial one is an
// error below.
SequenceBuffers hcBuffers(const LayerProgram& program, const float* input,
                          const std::map<std::string, const float*>& sides, const float* h0,
                          const float* c0, const int64_t* lengths, float* output, float* hn,
                          float* cn) {
  SequenceBuffers buffers;
  buffers.input = input;
  buffers.sideInputs = sides;
  buffers.lengths = lengths;
  buffers.output = output;
  const float* initial[] = {h0, c0};
  float* final[] = {hn, cn};
  const char* names[] = {"h", "c"};
  for (int i = 0; i < 2; ++i) {
    if (initial[i])
      buffers.initialStates[names[i]] = initial[i];
    if (final[i] && program.cell().findArgument(names[i]))
      buffers.finalStates[names[i]] = final[i];
  }
  return buffers;
}

// A cell's state by name, or an error that names the buffer and lists the cell's states.
void checkState(const LayerProgram& program, const std::string& state, const std::string& what) {
  const ir::Value* value = program.cell().findArgument(state);
  if (value && value->argKind == ir::ArgKind::State)
    return;
  std::string states;
  for (const auto& s : program.cell().states)
    states += (states.empty() ? "" : ", ") + s->name;
  throw UserError(what + " is given but cell '" + program.cell().name + "' has no state '" + state +
                  "' (its states: " + states + ")");
}

// A forward call's buffers as the layer runner's tensors, checked.
struct ForwardArgs {
  Tensor input;
  std::map<std::string, Tensor> initialStates, sideInputs;
  std::optional<Int64Array> lengths;
};

ForwardArgs forwardArgs(const Layer::Impl& impl, const char* call, const SequenceBuffers& buffers,
                        int64_t steps, int64_t batch) {
  const LayerProgram& program = *impl.program;
  if (!buffers.input || !buffers.output || steps < 1 || batch < 1)
    throw UserError(std::string(call) + " needs an input, an output, and T and B of at least 1");
  auto sequence = [&](int64_t features) {
    return impl.batchFirst ? TensorShape{batch, steps, features}
                           : TensorShape{steps, batch, features};
  };
  ForwardArgs args;
  args.input = copyIn(buffers.input, sequence(program.inputSize()));
  const int64_t slots = program.numLayers() * program.numDirections();
  for (const auto& [name, data] : buffers.initialStates) {
    checkState(program, name, "an initial " + name);
    if (!data)
      throw UserError("initial state '" + name + "' is a null pointer");
    args.initialStates[name] = copyIn(data, {slots, batch, program.stateSize(name)});
  }
  for (const auto& [name, data] : buffers.finalStates)
    checkState(program, name, "a buffer for the final " + name);
  if (buffers.lengths)
    args.lengths =
        Int64Array{{batch}, std::vector<int64_t>(buffers.lengths, buffers.lengths + batch)};
  for (const auto& [name, data] : buffers.sideInputs) {
    const int64_t features = program.sideInputSize(name);
    if (!data)
      throw UserError("side input '" + name + "' is a null pointer");
    args.sideInputs[name] = copyIn(data, sequence(features));
  }
  return args;
}

void copyOutResults(const LayerResult& result, const SequenceBuffers& buffers) {
  copyOut(result.output, buffers.output);
  for (const auto& [name, to] : buffers.finalStates)
    copyOut(result.finalStates.at(name), to);
}

} // namespace

void Layer::forward(const float* input, int64_t steps, int64_t batch, const float* h0,
                    const float* c0, const int64_t* lengths, float* output, float* hn,
                    float* cn) const {
  forward(hcBuffers(*impl_->program, input, {}, h0, c0, lengths, output, hn, cn), steps, batch);
}

void Layer::forward(const float* input, const std::map<std::string, const float*>& sideInputs,
                    int64_t steps, int64_t batch, const float* h0, const float* c0,
                    const int64_t* lengths, float* output, float* hn, float* cn) const {
  forward(hcBuffers(*impl_->program, input, sideInputs, h0, c0, lengths, output, hn, cn), steps,
          batch);
}

void Layer::forward(const SequenceBuffers& buffers, int64_t steps, int64_t batch) const {
  ForwardArgs args = forwardArgs(*impl_, "forward", buffers, steps, batch);
  copyOutResults(impl_->program->run(args.input, args.initialStates, args.lengths, args.sideInputs),
                 buffers);
}

TrainingRecord Layer::forwardTraining(const float* input, int64_t steps, int64_t batch,
                                      const float* h0, const float* c0, const int64_t* lengths,
                                      float* output, float* hn, float* cn) const {
  return forwardTraining(hcBuffers(*impl_->program, input, {}, h0, c0, lengths, output, hn, cn),
                         steps, batch);
}

TrainingRecord Layer::forwardTraining(const SequenceBuffers& buffers, int64_t steps,
                                      int64_t batch) const {
  ForwardArgs args = forwardArgs(*impl_, "forwardTraining", buffers, steps, batch);
  auto impl = std::make_shared<TrainingRecord::Impl>();
  impl->tape = impl_->trainingProgram().forward(std::move(args.input), args.initialStates,
                                                args.lengths, args.sideInputs);
  copyOutResults(impl->tape.forward, buffers);
  impl->tape.forward.output = Tensor(); // the caller's now: the backward reads its shape only
  TrainingRecord record;
  record.impl_ = std::move(impl);
  return record;
}

std::map<std::string, WeightTensor> Layer::backward(const TrainingRecord& record,
                                                    const float* gradOutput, const float* gradHn,
                                                    const float* gradCn) const {
  std::map<std::string, const float*> gradFinalStates;
  if (gradHn)
    gradFinalStates["h"] = gradHn;
  if (gradCn)
    gradFinalStates["c"] = gradCn;
  return backward(record, gradOutput, gradFinalStates);
}

namespace {

// The gradients flowing into a backward() call, checked and copied in.
GradientInputs gradientInputs(const LayerProgram& program, const TrainingTape& tape,
                              const float* gradOutput,
                              const std::map<std::string, const float*>& gradFinalStates) {
  GradientInputs grads;
  if (gradOutput)
    grads.output = copyIn(gradOutput, tape.outputShape);
  for (const auto& [name, data] : gradFinalStates) {
    checkState(program, name, "a gradient of the final " + name);
    if (data)
      grads.finalStates[name] = copyIn(data, tape.forward.finalStates.at(name).shape());
  }
  return grads;
}

std::map<std::string, WeightTensor> toWeightTensors(TensorMap&& tensors) {
  std::map<std::string, WeightTensor> out;
  for (auto& [name, tensor] : tensors)
    out[name] = {tensor.shape(),
                 std::vector<float>(tensor.values().begin(), tensor.values().end())};
  return out;
}

const TrainingTape& tapeOf(const TrainingRecord::Impl* record) {
  if (!record)
    throw UserError("backward needs the record of a forwardTraining() call");
  return record->tape;
}

} // namespace

std::map<std::string, WeightTensor>
Layer::backward(const TrainingRecord& record, const float* gradOutput,
                const std::map<std::string, const float*>& gradFinalStates) const {
  const TrainingTape& tape = tapeOf(record.impl_.get());
  return toWeightTensors(impl_->trainingProgram().backward(
      tape, gradientInputs(*impl_->program, tape, gradOutput, gradFinalStates)));
}

std::map<std::string, WeightTensor>
Layer::backward(const TrainingRecord& record, const float* gradOutput,
                const std::map<std::string, const float*>& gradFinalStates,
                GradientSums& sums) const {
  const TrainingTape& tape = tapeOf(record.impl_.get());
  const GradientInputs grads = gradientInputs(*impl_->program, tape, gradOutput, gradFinalStates);
  GradientSums::Impl& into = *sums.impl_;
  std::lock_guard<std::mutex> lock(into.mutex);
  if (into.broken)
    throw UserError("these gradient sums are incomplete: a backward() adding into them failed");
  try {
    return toWeightTensors(impl_->trainingProgram().backward(tape, grads, into.sums));
  } catch (...) {
    into.broken = true;
    throw;
  }
}

void Layer::forwardPacked(const float* data, const int64_t* batchSizes, int64_t steps,
                          const int64_t* sortedIndices, const float* h0, const float* c0,
                          float* outputData, float* hn, float* cn) const {
  if (impl_->batchFirst)
    throw UserError("forwardPacked takes no batchFirst layer: packed data has no batch axis");
  if (!data || !batchSizes || !outputData || steps < 1 || batchSizes[0] < 1)
    throw UserError("forwardPacked needs data, batch sizes, an output, and at least one step");
  const int64_t batch = batchSizes[0];
  for (int64_t t = 1; t < steps; ++t)
    if (batchSizes[t] > batchSizes[t - 1] || batchSizes[t] < 1)
      throw UserError("batchSizes must be positive and non-increasing; batchSizes[" +
                      std::to_string(t) + "] = " + std::to_string(batchSizes[t]) + " after " +
                      std::to_string(batchSizes[t - 1]));
  std::vector<int64_t> original(static_cast<size_t>(batch));
  std::vector<bool> seen(static_cast<size_t>(batch), false);
  for (int64_t i = 0; i < batch; ++i) {
    original[i] = sortedIndices ? sortedIndices[i] : i;
    if (original[i] < 0 || original[i] >= batch || seen[original[i]])
      throw UserError("sortedIndices must be a permutation of [0, " + std::to_string(batch) + ")");
    seen[original[i]] = true;
  }
  // Unpack into padded [T, B, F] with lengths, in the caller's batch order.
  const int64_t in = inputSize(), out = outputSize();
  std::vector<int64_t> lengths(static_cast<size_t>(batch), 0);
  std::vector<float> padded(static_cast<size_t>(steps * batch * in), 0.0f);
  int64_t row = 0;
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t i = 0; i < batchSizes[t]; ++i, ++row) {
      lengths[original[i]] = t + 1;
      std::memcpy(&padded[(t * batch + original[i]) * in], data + row * in,
                  static_cast<size_t>(in) * sizeof(float));
    }
  std::vector<float> paddedOut(static_cast<size_t>(steps * batch * out));
  forward(padded.data(), steps, batch, h0, c0, lengths.data(), paddedOut.data(), hn, cn);
  row = 0;
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t i = 0; i < batchSizes[t]; ++i, ++row)
      std::memcpy(outputData + row * out, &paddedOut[(t * batch + original[i]) * out],
                  static_cast<size_t>(out) * sizeof(float));
}

CellStep CellStep::fromFile(const std::string& cell, const std::string& weightsPath) {
  LayerSpec spec;
  spec.cell = cell;
  spec.numLayers = 1;
  spec.bidirectional = false;
  return CellStep(Layer::fromFile(spec, weightsPath));
}

CellStep CellStep::fromWeights(const std::string& cell,
                               const std::map<std::string, WeightTensor>& weights) {
  LayerSpec spec;
  spec.cell = cell;
  spec.numLayers = 1;
  spec.bidirectional = false;
  return CellStep(Layer::fromWeights(spec, weights));
}

int64_t CellStep::inputSize() const {
  return layer_.inputSize();
}
int64_t CellStep::stateSize(const std::string& state) const {
  return layer_.stateSize(state);
}

void CellStep::step(const SequenceBuffers& buffers, int64_t batch) const {
  if (buffers.output) {
    layer_.forward(buffers, 1, batch);
    return;
  }
  std::vector<float> output(static_cast<size_t>(batch * layer_.outputSize()));
  SequenceBuffers withOutput = buffers;
  withOutput.output = output.data();
  layer_.forward(withOutput, 1, batch);
}

std::vector<std::string> CellStep::stateNames() const {
  return layer_.stateNames();
}

void CellStep::step(const float* x, int64_t batch, const float* h, const float* c, float* hNext,
                    float* cNext) const {
  // A sequence of one step: the output is the new h.
  std::vector<float> output(static_cast<size_t>(batch * layer_.outputSize()));
  layer_.forward(x, 1, batch, h, c, nullptr, output.data(), hNext, cNext);
}

} // namespace rnnc

#include "runtime/layers/DirectionRun.h"

#include "ir/Error.h"
#include "runtime/exec/Hash.h"
#include "runtime/layers/PackedBatch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>

namespace rnnc {
namespace {

// A padded run whose first row is packed row `firstRow` (where its dropout masks' rows start).
using PaddedFrom = std::function<Tensor(int64_t steps, int64_t batch, const CellInputs& inputs,
                                        std::vector<Tensor>& states, int64_t firstRow)>;

// A packed batch run one stretch of steps with the same active batch at a time, each stretch a
// padded run of its rows: for an executor with no packed entry of its own.
Tensor runPackedByStretches(const PaddedFrom& padded, const CellInputs& inputs,
                            const std::vector<int64_t>& batchSizes, std::vector<Tensor>& states) {
  Tensor output;
  for (const Stretch& stretch : stretchesOf(batchSizes)) {
    const int64_t active = stretch.active, firstRow = stretch.firstRow;
    CellInputs segment;
    for (const InputRows& input : inputs)
      segment.push_back({input.data + firstRow * input.stride, stretch.steps * active,
                         input.columns, input.stride});
    std::vector<Tensor> activeStates;
    for (const Tensor& state : states)
      activeStates.emplace_back(TensorShape{active, state.dim(1)},
                                std::vector<float>(state.data(), row(state, active)));
    Tensor out = padded(stretch.steps, active, segment, activeStates, firstRow);
    for (size_t s = 0; s < states.size(); ++s)
      std::copy(activeStates[s].data(), activeStates[s].data() + activeStates[s].numel(),
                states[s].data());
    if (output.numel() == 0)
      output = Tensor({inputs.at(0).rows, out.dim(2)});
    std::copy(out.data(), out.data() + out.numel(), row(output, firstRow));
  }
  return output;
}

} // namespace

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
  Tensor out = Tensor::uninitialized({b, a, f});
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      std::memcpy(row(out, j * a + i), row(t, i * b + j), static_cast<size_t>(f) * sizeof(float));
  out.setSource(t.source());
  return out;
}

DirectionRun runDirection(const Executor& run, const CellInputs& inputs, int64_t steps,
                          int64_t batch, std::vector<Tensor> states,
                          const std::vector<int64_t>& lengths, bool reverse) {
  for (const InputRows& input : inputs)
    RNNC_INTERNAL_CHECK(input.rows == steps * batch, "a direction's inputs differ in rows");
  DirectionRun result;
  bool padded = std::all_of(lengths.begin(), lengths.end(), [&](int64_t l) { return l == steps; });
  if (padded && (!reverse || run.reversed)) { // nothing to pack
    result.output = reverse ? run.reversed(steps, batch, inputs, states)
                            : run.padded(steps, batch, inputs, states);
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
    Tensor sorted = Tensor::uninitialized(state.shape());
    for (int64_t i = 0; i < batch; ++i)
      std::memcpy(row(sorted, i), row(state, order[i]),
                  static_cast<size_t>(state.dim(1)) * sizeof(float));
    state = std::move(sorted);
  }
  std::vector<Tensor> packed;
  CellInputs packedInputs;
  for (const InputRows& input : inputs) {
    Tensor rows = Tensor::uninitialized({packedRows, input.columns});
    for (int64_t r = 0; r < packedRows; ++r)
      std::memcpy(row(rows, r), input.data + paddedRow[r] * input.stride,
                  static_cast<size_t>(input.columns) * sizeof(float));
    packedInputs.push_back(InputRows::of(rows));
    packed.push_back(std::move(rows));
  }

  Tensor out =
      run.packed
          ? run.packed(packedInputs, batchSizes, states)
          : runPackedByStretches([&](int64_t steps, int64_t batch, const CellInputs& inputs,
                                     std::vector<Tensor>& states,
                                     int64_t) { return run.padded(steps, batch, inputs, states); },
                                 packedInputs, batchSizes, states);

  // Zero past each length; where every sequence is whole, each row is copied over.
  result.output = padded ? Tensor::uninitialized({steps, batch, out.dim(1)})
                         : Tensor({steps, batch, out.dim(1)});
  for (int64_t r = 0; r < packedRows; ++r)
    std::memcpy(row(result.output, paddedRow[r]), row(out, r),
                static_cast<size_t>(out.dim(1)) * sizeof(float));
  for (Tensor& state : states) { // back to the caller's order
    Tensor unsorted = Tensor::uninitialized(state.shape());
    for (int64_t i = 0; i < batch; ++i)
      std::memcpy(row(unsorted, order[i]), row(state, i),
                  static_cast<size_t>(state.dim(1)) * sizeof(float));
    result.final.push_back(std::move(unsorted));
  }
  return result;
}

CellInputs columnsOf(const Tensor& t, const std::vector<int64_t>& widths, int64_t first) {
  const int64_t stride = t.shape().back();
  const int64_t rows = stride == 0 ? 0 : t.numel() / stride;
  CellInputs views;
  int64_t offset = first;
  for (int64_t width : widths) {
    RNNC_INTERNAL_CHECK(offset + width <= stride, "columns past the tensor's width");
    views.push_back({t.data() + offset, rows, width, stride});
    offset += width;
  }
  return views;
}

Tensor denseCopy(const InputRows& rows, TensorShape shape) {
  Tensor out = Tensor::uninitialized(std::move(shape));
  RNNC_INTERNAL_CHECK(out.numel() == rows.rows * rows.columns, "a dense copy of another size");
  for (int64_t r = 0; r < rows.rows; ++r)
    std::memcpy(out.data() + r * rows.columns, rows.data + r * rows.stride,
                static_cast<size_t>(rows.columns) * sizeof(float));
  return out;
}

// Dropout on a layer's output before the next layer: zero with probability p, else scaled by
// 1 / (1 - p); the mask is a pure function of (seed, layer, element): element i is dropped where
// unitInterval(splitmix64(splitmix64(seed ^ layer << 40) ^ i)) < p. The layer's hash is the
// same for every element, and the comparison is made in integers (dropoutThreshold, the same
// mask): 6.5 M elements 2.4-2.7 -> 1.9 ms (Zen 5, _rnnc.between_layers_mask, medians).
void dropoutBetweenLayers(Tensor& t, double p, uint64_t seed, int layer) {
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const uint64_t layerHash = splitmix64(seed ^ (static_cast<uint64_t>(layer) << 40));
  const uint64_t threshold = dropoutThreshold(p);
  float* data = t.data();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    data[i] = (splitmix64(layerHash ^ static_cast<uint64_t>(i)) >> 11) < threshold
                  ? 0.0f
                  : data[i] * scale;
}

std::unique_ptr<CompiledCell::Workspace> WorkspacePool::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.empty())
    return std::make_unique<CompiledCell::Workspace>();
  auto workspace = std::move(free_.back());
  free_.pop_back();
  return workspace;
}

void WorkspacePool::give(std::unique_ptr<CompiledCell::Workspace> workspace) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(std::move(workspace));
}

namespace {

// Each input as a dense [steps, batch, F] tensor, for the executors that take tensors.
std::vector<Tensor> denseInputs(const CellInputs& inputs, int64_t steps, int64_t batch) {
  std::vector<Tensor> tensors;
  for (const InputRows& input : inputs)
    tensors.push_back(denseCopy(input, {steps, batch, input.columns}));
  return tensors;
}

} // namespace

Executor jitExecutor(std::shared_ptr<const CompiledCell> cell,
                     std::shared_ptr<const CompiledCell::Prepared> prepared, int threads,
                     std::shared_ptr<WorkspacePool> pool, uint64_t maskSeed) {
  if (!pool)
    pool = std::make_shared<WorkspacePool>();
  Executor run;
  auto padded = [=](bool reverse) {
    return
        [=](int64_t steps, int64_t batch, const CellInputs& inputs, std::vector<Tensor>& states) {
          Tensor output;
          auto workspace = pool->take();
          cell->run(*prepared, steps, batch, inputs, states, output, *workspace, threads, reverse,
                    maskSeed);
          pool->give(std::move(workspace));
          return output;
        };
  };
  run.padded = padded(false);
  run.reversed = padded(true);
  run.packed = [=](const CellInputs& inputs, const std::vector<int64_t>& batchSizes,
                   std::vector<Tensor>& states) {
    Tensor output;
    auto workspace = pool->take();
    cell->runPacked(*prepared, inputs, batchSizes, states, output, *workspace, threads, maskSeed);
    pool->give(std::move(workspace));
    return output;
  };
  return run;
}

Executor interpreterExecutor(std::shared_ptr<const Interpreter> interpreter) {
  Executor run;
  run.padded = [=](int64_t steps, int64_t batch, const CellInputs& inputs,
                   std::vector<Tensor>& states) {
    return interpreter->run(denseInputs(inputs, steps, batch), states);
  };
  // Each stretch's dropout masks from its first packed row on, as the JIT's packed runs draw them.
  run.packed = [=](const CellInputs& inputs, const std::vector<int64_t>& batchSizes,
                   std::vector<Tensor>& states) {
    return runPackedByStretches(
        [&](int64_t steps, int64_t batch, const CellInputs& segment, std::vector<Tensor>& states,
            int64_t firstRow) {
          return interpreter->run(denseInputs(segment, steps, batch), states, firstRow);
        },
        inputs, batchSizes, states);
  };
  return run;
}

Executor gpuExecutor(std::shared_ptr<const GpuCell> cell, std::vector<Tensor> params, bool device) {
  Executor run;
  run.padded = [=](int64_t steps, int64_t batch, const CellInputs& inputs,
                   std::vector<Tensor>& states) {
    std::vector<Tensor> tensors = denseInputs(inputs, steps, batch);
    return device ? cell->run(params, tensors, states) : cell->emulate(params, tensors, states);
  };
  return run;
}

std::vector<int64_t> checkedLengths(const std::optional<Int64Array>& given, int64_t steps,
                                    int64_t batch) {
  if (!given)
    return std::vector<int64_t>(static_cast<size_t>(batch), steps);
  const Int64Array& lengths = *given;
  if (lengths.shape != TensorShape{batch})
    throw UserError(fmt::format("{} has shape {}, expected [B] = [{}] (one length per "
                                "sequence of the batch)",
                                describeTensor("lengths", lengths.source),
                                shapeToString(lengths.shape), batch));
  for (size_t i = 0; i < lengths.values.size(); ++i)
    if (lengths.values[i] < 1 || lengths.values[i] > steps)
      throw UserError(fmt::format(
          "{} is out of range: lengths must be in [1, T] = [1, {}]",
          describeTensor(fmt::format("lengths[{}] = {}", i, lengths.values[i]), lengths.source),
          steps));
  return lengths.values;
}

} // namespace rnnc

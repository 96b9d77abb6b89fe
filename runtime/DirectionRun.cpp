#include "runtime/DirectionRun.h"

#include "ir/Error.h"
#include "runtime/Hash.h"
#include "runtime/PackedBatch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>

namespace rnnc {
namespace {

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
  Tensor out({b, a, f});
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      std::memcpy(row(out, j * a + i), row(t, i * b + j), static_cast<size_t>(f) * sizeof(float));
  out.setSource(t.source());
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

namespace {

// The cell's inputs as columns of the side-by-side tensor `in` ([T, B, W] or [N, W]), read where
// they are.
std::vector<InputRows> columnsOf(const Tensor& in, const std::vector<int64_t>& widths) {
  const int64_t stride = in.shape().back();
  const int64_t rows = stride == 0 ? 0 : in.numel() / stride;
  std::vector<InputRows> views;
  int64_t offset = 0;
  for (int64_t width : widths) {
    views.push_back({in.data() + offset, rows, width, stride});
    offset += width;
  }
  return views;
}

// Workspaces kept between calls of one executor (a run then allocates no scratch memory: its
// buffers are tens of megabytes, and fresh pages cost a fault each); one per concurrent call.
class WorkspacePool {
public:
  std::unique_ptr<CompiledCell::Workspace> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty())
      return std::make_unique<CompiledCell::Workspace>();
    auto workspace = std::move(free_.back());
    free_.pop_back();
    return workspace;
  }
  void give(std::unique_ptr<CompiledCell::Workspace> workspace) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(workspace));
  }

private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<CompiledCell::Workspace>> free_;
};

} // namespace

Executor jitExecutor(std::shared_ptr<const CompiledCell> cell,
                     std::shared_ptr<const CompiledCell::Prepared> prepared, int threads,
                     std::vector<int64_t> widths) {
  auto pool = std::make_shared<WorkspacePool>();
  Executor run;
  run.padded = [=](const Tensor& in, std::vector<Tensor>& states) {
    Tensor output;
    auto workspace = pool->take();
    cell->run(*prepared, in.dim(0), columnsOf(in, widths), states, output, *workspace, threads);
    pool->give(std::move(workspace));
    return output;
  };
  run.packed = [=](const Tensor& in, const std::vector<int64_t>& batchSizes,
                   std::vector<Tensor>& states) {
    Tensor output;
    auto workspace = pool->take();
    cell->runPacked(*prepared, columnsOf(in, widths), batchSizes, states, output, *workspace,
                    threads);
    pool->give(std::move(workspace));
    return output;
  };
  return run;
}

Executor interpreterExecutor(std::shared_ptr<const Interpreter> interpreter,
                             std::vector<int64_t> widths) {
  Executor run;
  run.padded = [=](const Tensor& in, std::vector<Tensor>& states) {
    return interpreter->run(splitFeatures(in, widths), states);
  };
  return run;
}

Executor gpuExecutor(std::shared_ptr<const GpuCell> cell, std::vector<Tensor> params, bool device,
                     std::vector<int64_t> widths) {
  Executor run;
  run.padded = [=](const Tensor& in, std::vector<Tensor>& states) {
    return device ? cell->run(params, splitFeatures(in, widths), states)
                  : cell->emulate(params, splitFeatures(in, widths), states);
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

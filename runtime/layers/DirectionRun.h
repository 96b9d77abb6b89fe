// One layer in one direction over a whole batch, with variable lengths and the reverse
// direction's per-sequence reversal (sorted, packed and unpacked), for any executor of a bound
// cell: what the layer runner and the gradient runner share.
#pragma once

#include "runtime/data/Tensor.h"
#include "runtime/exec/CompiledCell.h"
#include "runtime/exec/Interpreter.h"
#include "runtime/gpu/GpuCell.h"

#include <memory>
#include <optional>

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace rnnc {

// A cell's inputs for one direction of a layer, in cell order: each input's rows where they are
// (a tensor of its own, or columns of a wider one: the training's saved values).
using CellInputs = std::vector<InputRows>;

// Runs a bound cell, the JIT or the interpreter. `padded`: inputs of `steps` * `batch` rows, states
// [B, F] updated, returns outputs [T, B, H]. `packed`: the same over a packed batch (see
// CompiledCell::runPacked), inputs of N rows, returns outputs [N, H].
struct Executor {
  std::function<Tensor(int64_t steps, int64_t batch, const CellInputs& inputs,
                       std::vector<Tensor>& states)>
      padded;
  // Optional: `padded` with the steps run from the last to the first (output rows at their
  // steps); where absent, a reverse direction runs packed on reversed copies.
  std::function<Tensor(int64_t steps, int64_t batch, const CellInputs& inputs,
                       std::vector<Tensor>& states)>
      reversed;
  std::function<Tensor(const CellInputs& inputs, const std::vector<int64_t>& batchSizes,
                       std::vector<Tensor>& states)>
      packed;
};

// One direction of one layer over the whole batch. `lengths` empty: every sequence has T steps.
struct DirectionRun {
  Tensor output;             // [T, B, H], zero past each length
  std::vector<Tensor> final; // per state, [B, F]
};

// Workspaces kept between calls (a run then allocates no scratch memory: its buffers are tens
// of megabytes, and fresh pages cost a fault each); one per concurrent call. A layer keeps one
// per slot.
class WorkspacePool {
public:
  std::unique_ptr<CompiledCell::Workspace> take();
  void give(std::unique_ptr<CompiledCell::Workspace> workspace);

private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<CompiledCell::Workspace>> free_;
};

// Executors of a cell: compiled code on `threads` threads (its workspaces from `pool`, a fresh
// pool where none is given; `maskSeed` seeds a training cell's dropout masks, as
// ExecutionOptions::seed does the interpreter's), the interpreter, or the GPU's kernels on the
// GPU (`device`) or emulated on this CPU. The JIT and the interpreter draw the same masks: their
// rows counted in the order the steps run (the packed rows of a variable-length batch).
Executor jitExecutor(std::shared_ptr<const CompiledCell> cell,
                     std::shared_ptr<const CompiledCell::Prepared> prepared, int threads,
                     std::shared_ptr<WorkspacePool> pool = nullptr, uint64_t maskSeed = 0);
Executor interpreterExecutor(std::shared_ptr<const Interpreter> interpreter);
Executor gpuExecutor(std::shared_ptr<const GpuCell> cell, std::vector<Tensor> params, bool device);

// `inputs` of T * B rows each, `states` [B, F] each (initial values), `lengths` [B] (every entry
// T: no packing unless `reverse`). The reverse direction runs each sequence from its own last
// step.
DirectionRun runDirection(const Executor& run, const CellInputs& inputs, int64_t steps,
                          int64_t batch, std::vector<Tensor> states,
                          const std::vector<int64_t>& lengths, bool reverse);

// Columns of a [..., W] tensor as inputs: `widths` features each, from column `first` on.
CellInputs columnsOf(const Tensor& t, const std::vector<int64_t>& widths, int64_t first = 0);
// An input's rows as a dense tensor of `shape`.
Tensor denseCopy(const InputRows& rows, TensorShape shape);

// Row `index` of a [N, F] or [A, B, F] tensor viewed as rows of its last dimension.
float* row(Tensor& t, int64_t index);
const float* row(const Tensor& t, int64_t index);

// [A, B, F] -> [B, A, F].
Tensor swapLeadingDims(const Tensor& t);

// Dropout on a layer's output before the next layer: zero with probability p, else scaled by
// 1 / (1 - p); the mask is a pure function of (seed, layer, element).
void dropoutBetweenLayers(Tensor& t, double p, uint64_t seed, int layer);

// The lengths [B] checked (each in [1, T]); every sequence T steps long when none are given.
std::vector<int64_t> checkedLengths(const std::optional<Int64Array>& given, int64_t steps,
                                    int64_t batch);

} // namespace rnnc

// One layer in one direction over a whole batch, with variable lengths and the reverse
// direction's per-sequence reversal (sorted, packed and unpacked), for any executor of a bound
// cell: what the layer runner and the gradient runner share.
#pragma once

#include "runtime/CompiledCell.h"
#include "runtime/GpuCell.h"
#include "runtime/Interpreter.h"
#include "runtime/Tensor.h"

#include <memory>
#include <optional>

#include <cstdint>
#include <functional>
#include <vector>

namespace rnnc {

// Runs a bound cell, the JIT or the interpreter. `padded`: inputs [T, B, F], states [B, F]
// updated, returns outputs [T, B, H]. `packed`: the same over a packed batch (see
// CompiledCell::runPacked), input [N, F], returns outputs [N, H].
struct Executor {
  std::function<Tensor(const Tensor& input, std::vector<Tensor>& states)> padded;
  std::function<Tensor(const Tensor& input, const std::vector<int64_t>& batchSizes,
                       std::vector<Tensor>& states)>
      packed;
};

// One direction of one layer over the whole batch. `lengths` empty: every sequence has T steps.
struct DirectionRun {
  Tensor output;             // [T, B, H], zero past each length
  std::vector<Tensor> final; // per state, [B, F]
};

// Executors of a cell whose inputs arrive side by side in one tensor, `widths` features each
// (concatFeatures): compiled code on `threads` threads, or the interpreter.
Executor jitExecutor(std::shared_ptr<const CompiledCell> cell,
                     std::shared_ptr<const CompiledCell::Prepared> prepared, int threads,
                     std::vector<int64_t> widths);
Executor interpreterExecutor(std::shared_ptr<const Interpreter> interpreter,
                             std::vector<int64_t> widths);
// The GPU's kernels on the GPU (`device`), or emulated on this CPU.
Executor gpuExecutor(std::shared_ptr<const GpuCell> cell, std::vector<Tensor> params, bool device,
                     std::vector<int64_t> widths);

// `input` [T, B, F], `states` [B, F] each (initial values), `lengths` [B] (every entry T: no
// packing unless `reverse`). The reverse direction runs each sequence from its own last step.
DirectionRun runDirection(const Executor& run, const Tensor& input, std::vector<Tensor> states,
                          const std::vector<int64_t>& lengths, bool reverse);

// Row `index` of a [N, F] or [A, B, F] tensor viewed as rows of its last dimension.
float* row(Tensor& t, int64_t index);
const float* row(const Tensor& t, int64_t index);

// [A, B, F] -> [B, A, F].
Tensor swapLeadingDims(const Tensor& t);

// [..., F0], [..., F1], ... -> [..., F0 + F1 + ...]: several per-step tensors as one, so that
// sorting, reversing and packing move them together; splitFeatures is the inverse.
Tensor concatFeatures(const std::vector<const Tensor*>& parts);
std::vector<Tensor> splitFeatures(const Tensor& t, const std::vector<int64_t>& widths);

// Dropout on a layer's output before the next layer: zero with probability p, else scaled by
// 1 / (1 - p); the mask is a pure function of (seed, layer, element).
void dropoutBetweenLayers(Tensor& t, double p, uint64_t seed, int layer);

// The lengths [B] checked (each in [1, T]); every sequence T steps long when none are given.
std::vector<int64_t> checkedLengths(const std::optional<Int64Array>& given, int64_t steps,
                                    int64_t batch);

} // namespace rnnc

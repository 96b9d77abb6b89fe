// Whole RNN layers as torch.nn.LSTM/GRU/RNN and cuDNN run them: a cell stacked num_layers deep
// (layer k > 0 reads layer k-1's output), optionally in both directions (outputs concatenated,
// final states ordered layer-major, direction-minor), batch_first, and variable-length batches.
//
// Variable length follows cuDNN's packed layout: sequences sorted by length, so the batch active
// at each step is a prefix that only shrinks. Each run of steps with the same active batch is
// one call of the compiled cell on contiguous data, so no compute is spent on padding, and a
// finished sequence's state rows are left alone: they hold its state at its last valid step.
// The reverse direction runs each sequence backwards from its own last valid step.
//
// A cell with several inputs (`input x[...], y[...]`) takes its first as the layer's input (layer
// k > 0: layer k-1's output) and the others as side inputs: sequences every layer and direction
// reads at the same time step as the layer's input (an attention context, an AUGRU's attention
// score), each [T, B, F] like the input.
#pragma once

#include "ir/Cell.h"
#include "runtime/data/SafeTensors.h"
#include "runtime/exec/CompiledCell.h"
#include "runtime/exec/Engine.h"
#include "runtime/exec/Interpreter.h"
#include "runtime/gpu/GpuCell.h"
#include "runtime/layers/DirectionRun.h"

#include <functional>

#include <map>
#include <memory>
#include <optional>
#include <string>

namespace rnnc {

struct LayerOptions {
  std::optional<int> numLayers;      // checked against the weights; inferred when absent
  std::optional<bool> bidirectional; // likewise
  bool batchFirst = false;           // input and output are [B, T, F]
  double dropout = 0;                // between layers, in training only
  bool training = false;
  uint64_t seed = 0; // dropout masks; see maskSeedOf
  Engine engine = Engine::Jit;
  int threads = 0; // JIT threads per direction; 0: automatic, every core unless others are busy
  CompileOptions compile;
  ir::SizeMap sizes; // sizes given explicitly

  // The seed of the dropout masks a cell draws in slot `slot` (layer * directions + direction):
  // the training forward's and inference's alike.
  uint64_t maskSeedOf(int64_t slot) const { return seed + static_cast<uint64_t>(slot); }
};

struct LayerRequest {
  const TensorMap* weights = nullptr;
  // The same map, when runLayers may give it to the layers, which take its tensors (leaving them
  // empty) instead of copying them: a caller that reads its weights for one run (the rnnc tool).
  TensorMap* movableWeights = nullptr;
  std::string weightsSource = "weights";
  Tensor input;                                // [T, B, I] (or [B, T, I] with batchFirst)
  std::map<std::string, Tensor> sideInputs;    // the cell's other inputs by name, [T, B, F] each
  std::map<std::string, Tensor> initialStates; // state name -> [L*D, B, F]; absent = zeros
  std::optional<Int64Array> lengths;           // [B], any order, each in [1, T]
};

struct LayerResult {
  Tensor output;                             // [T, B, D*H] (or [B, T, D*H]), zero past lengths
  std::map<std::string, Tensor> finalStates; // state name -> [L*D, B, F]
  int numLayers = 1;
  bool bidirectional = false;
};

// A layer built once: the weights bound and every layer and direction compiled (or prepared
// for the interpreter). run() is thread-safe, each call using its own buffers, so one program
// can serve concurrent forward calls.
class LayerProgram {
public:
  // Each layer and direction binds its own sizes from `weights` (and options.sizes; a size only
  // an input or a state shows must be given there, unless `shapesOf` is: a request whose input,
  // side inputs and initial states the sizes are read from too, as runLayers does). Throws
  // UserError for weights that do not fit the cell or the options.
  static std::shared_ptr<const LayerProgram> build(const ir::Cell& cell, const TensorMap& weights,
                                                   const std::string& weightsSource,
                                                   const LayerOptions& options,
                                                   const struct LayerRequest* shapesOf = nullptr);
  // The same, taking the weights' tensors instead of copying them (a copy of every weight saved
  // where the caller has no further use for them).
  static std::shared_ptr<const LayerProgram> build(const ir::Cell& cell, TensorMap&& weights,
                                                   const std::string& weightsSource,
                                                   const LayerOptions& options,
                                                   const struct LayerRequest* shapesOf = nullptr);

  // Runs one layer in one direction in place of the slot's own executor (the gradient
  // runner's training forward, which keeps what the backward reads): the cell's `inputs`,
  // [T, B, F] each, which the runner may keep without a copy (a layer's input is the output of
  // the layer below, its directions' inputs are one tensor); `states` are the initial values.
  using SlotRunner = std::function<DirectionRun(
      int64_t slot, const std::vector<std::shared_ptr<const Tensor>>& inputs, int64_t steps,
      int64_t batch, std::vector<Tensor> states, const std::vector<int64_t>& lengths,
      bool reverse)>;

  // `sideInputs`: one tensor for each input of the cell past its first, by name, laid out like
  // `input`. The input is read where it lies unless a slot runner may keep it past the call:
  // then it is copied, unless given as an rvalue (moved). `dropoutSeed`: the seed of this
  // call's masks of the dropout between layers, in place of options' (a training forward
  // drawing new masks at every call of one program).
  LayerResult run(const Tensor& input, const std::map<std::string, Tensor>& initialStates,
                  const std::optional<Int64Array>& lengths,
                  const std::map<std::string, Tensor>& sideInputs = {},
                  const SlotRunner& slotRunner = {},
                  std::optional<uint64_t> dropoutSeed = std::nullopt) const;
  LayerResult run(Tensor&& input, const std::map<std::string, Tensor>& initialStates,
                  const std::optional<Int64Array>& lengths,
                  const std::map<std::string, Tensor>& sideInputs = {},
                  const SlotRunner& slotRunner = {},
                  std::optional<uint64_t> dropoutSeed = std::nullopt) const;

  int numLayers() const { return numLayers_; }
  int numDirections() const { return directions_; }
  int64_t inputSize() const { return inputSize_; }
  int64_t outputSize() const { return outputSize_; } // num_directions * H_out
  // The names of the cell's inputs past the first, in declaration order, and their features.
  std::vector<std::string> sideInputNames() const;
  int64_t sideInputSize(const std::string& name) const;
  // Features of one slot of a state, as bound by the weights.
  int64_t stateSize(const std::string& state) const;
  const ir::Cell& cell() const { return *cell_; }
  const LayerOptions& options() const { return options_; }

  // One layer in one direction.
  struct Slot {
    std::vector<std::string> paramNames; // as in the weights, for messages
    std::vector<Tensor> params;
    std::vector<bool> inWeights; // per parameter; false: a zero bias a bias-free file lacks
    std::shared_ptr<ir::Cell> bound;
    std::shared_ptr<CompiledCell> compiled;                 // null: run on the interpreter
    std::shared_ptr<const CompiledCell::Prepared> prepared; // its parameter-only work, done
    std::shared_ptr<const GpuCell> gpu; // the GPU engines' code (Engine::Cuda, CudaEmulated)
    // The compiled code's scratch memory, kept between runs.
    std::shared_ptr<WorkspacePool> workspaces = std::make_shared<WorkspacePool>();
    // Masks of a dropout of parameters alone among `params`: drawn when the slot is built, from
    // options.seed, so that a run with another seed needs another program.
    bool parameterMasks = false;
  };
  const std::vector<Slot>& slots() const { return slots_; }

  // The side inputs checked against the cell and the input's T and B, in [T, B, F] layout.
  std::map<std::string, Tensor> checkedSideInputs(const std::map<std::string, Tensor>& given,
                                                  int64_t steps, int64_t batch) const;

private:
  // run's body, on the input as the layers may hold it.
  LayerResult runOn(std::shared_ptr<const Tensor> input,
                    const std::map<std::string, Tensor>& initialStates,
                    const std::optional<Int64Array>& lengths,
                    const std::map<std::string, Tensor>& sideInputs, const SlotRunner& slotRunner,
                    std::optional<uint64_t> dropoutSeed) const;
  LayerProgram() = default;
  // build's body: `movable`, when given, is `weights`, whose tensors may be taken.
  static std::shared_ptr<const LayerProgram>
  buildTaking(const ir::Cell& cell, const TensorMap& weights, TensorMap* movable,
              const std::string& weightsSource, const LayerOptions& options,
              const LayerRequest* shapesOf);
  std::unique_ptr<ir::Cell> cell_;
  std::string weightsSource_;
  LayerOptions options_;
  int numLayers_ = 0, directions_ = 1;
  int threads_ = 0; // options_.threads: 0 is automatic (runtime/threads/ThreadGovernor.h)
  int64_t inputSize_ = 0, outputSize_ = 0;
  std::vector<Slot> slots_; // layer-major, direction-minor, as PyTorch orders h_n
};

// Builds and runs in one go.
LayerResult runLayers(const ir::Cell& cell, const LayerRequest& request,
                      const LayerOptions& options);

} // namespace rnnc

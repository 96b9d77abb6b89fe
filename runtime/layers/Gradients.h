// Backpropagation through time for whole layers (issue 14): stacked, bidirectional, variable
// length, batch_first, any cell the autodiff pass differentiates.
//
// Per layer and direction, two cells derived from the bound cell (passes/Autodiff.h) run
// through the same executors as inference (the JIT or the interpreter) and the same direction
// runner (sorting, packing, per-sequence reversal):
//   - the training forward, whose output carries, per step, what the backward reads: the
//     cell's output, the states it leaves the step with and the values the autodiff pass keeps
//     (an LSTM: h, c and its four gates, as cuDNN's reserve space keeps the gates and c);
//   - the backward step, run backwards in time from each sequence's own end (its inputs, the
//     forward's states and the output gradients, are all known before it starts), whose
//     per-step output holds the input gradients and the factors of the parameter gradients.
//     The states entering each step are read from the step before (the initial state at a
//     sequence's first step).
// Parameter gradients are then a few large products over all rows: dW = sum_t g_t^T a_t as one
// GEMM, vectors as column sums, never per step.
#pragma once

#include "passes/Autodiff.h"
#include "runtime/layers/LayerRunner.h"

#include <map>
#include <memory>
#include <string>

namespace rnnc {

// What a training forward kept for its backward: per layer and direction the cell's inputs,
// its initial states and what the training forward wrote per step, and the run's lengths and
// results.
struct TrainingTape {
  LayerResult forward; // the results; a caller may take the output (backward needs its shape)
  TensorShape outputShape;
  std::vector<int64_t> lengths;
  struct Slot {
    // The cell's inputs, [T, B, F] each, shared with the layer runner: a layer's input is the
    // output of the layer below, the caller's input at layer 0; both directions read one.
    std::vector<std::shared_ptr<const Tensor>> inputs;
    std::vector<Tensor> initialStates; // [B, F] per state: what each sequence starts from
    // The training forward's outputs, [T, B, W] (passes::TrainingForward): the cell's output,
    // its states' next values and the kept values, each once; the backward reads them there.
    Tensor values;
    int64_t outputWidth = 0; // the cell's output's columns, the first of `values`
  };
  std::vector<Slot> slots;
  uint64_t seed = 0; // the seed the forward drew its dropout masks from
  // The bytes the tape holds beyond what cuDNN's caller keeps for its backward (the input and
  // the output, x and y): the training workspace, cuDNN's reserve space. An LSTM layer: its
  // four gates and c per step, plus the outputs of the layers under the last (the next one's
  // input) and the output while the tape still holds it (forward.output).
  int64_t bytes() const;
};

// The gradients flowing in. Absent ones are zeros.
struct GradientInputs {
  Tensor output;                             // dLoss/d(output), laid out as the output
  std::map<std::string, Tensor> finalStates; // dLoss/d(final state) by state name, [L*D, B, F]
};

// A layer built once for training: every slot's training forward and backward compiled.
class GradientProgram {
public:
  static std::shared_ptr<const GradientProgram>
  build(const ir::Cell& cell, const TensorMap& weights, const std::string& weightsSource,
        const LayerOptions& options, passes::ForwardValues forwardValues = {});
  // Taking the weights (no copy): a training step builds its program anew from fresh weights.
  static std::shared_ptr<const GradientProgram> build(const ir::Cell& cell, TensorMap&& weights,
                                                      const std::string& weightsSource,
                                                      const LayerOptions& options,
                                                      passes::ForwardValues forwardValues = {});
  // Over a layer program already built (its slots' bound cells and parameters; its own
  // compiled forward is not used), run as `options` say.
  static std::shared_ptr<const GradientProgram> build(std::shared_ptr<const LayerProgram> layers,
                                                      const LayerOptions& options,
                                                      passes::ForwardValues forwardValues = {});

  // The forward (as LayerProgram::run) keeping what backward() reads.
  // The tape keeps the input: a copy of it, or the tensor itself given as an rvalue. `seed`:
  // the seed of this call's dropout masks (in the cell and between layers), in place of the
  // options' (a module in training draws new masks at every call of one program); refused
  // where masks of parameters were drawn when the program was built (drawsMasksAtBuild()).
  TrainingTape forward(const Tensor& input, const std::map<std::string, Tensor>& initialStates,
                       const std::optional<Int64Array>& lengths,
                       const std::map<std::string, Tensor>& sideInputs = {},
                       std::optional<uint64_t> seed = std::nullopt) const;
  TrainingTape forward(Tensor&& input, const std::map<std::string, Tensor>& initialStates,
                       const std::optional<Int64Array>& lengths,
                       const std::map<std::string, Tensor>& sideInputs = {},
                       std::optional<uint64_t> seed = std::nullopt) const;
  // Whether a dropout of parameters alone (a weight's mask, one per run) drew its masks when
  // the program was built, from the options' seed: forward() then takes no other seed.
  bool drawsMasksAtBuild() const;

  // dLoss/d(each parameter) under its name in the weights (weight_ih_l0, bias_hh_l1_reverse,
  // ...; none for biases a bias-free file lacks), dLoss/d(input) as "input" (each side input
  // under its name), and dLoss/d(initial state) as "h0", "c0" (any other state: its name),
  // [L*D, B, F]; for loss = sum(output * grads.output) + sum(final state * its gradient).
  TensorMap backward(const TrainingTape& tape, const GradientInputs& grads) const;
  // The same, each parameter's gradient added into its entry of `parameterSums` (one absent
  // starts at zero) rather than returned: a loop that runs the program step by step (a decoder
  // stepping a cell) sums its parameters' gradients in place, in the products themselves,
  // instead of a gradient per call to be added up afterwards.
  TensorMap backward(const TrainingTape& tape, const GradientInputs& grads,
                     TensorMap& parameterSums) const;

  const LayerProgram& layers() const { return *program_; }

  struct Slot;

private:
  GradientProgram() = default;
  // backward(), the gradients added into `grads` (any parameter's there already: its sum).
  void backwardInto(const TrainingTape& tape, const GradientInputs& grads, TensorMap& out) const;
  std::shared_ptr<const LayerProgram> program_; // the slots' bound cells and parameters
  std::vector<std::shared_ptr<const Slot>> slots_;
  LayerOptions options_;
};

// A layer's request and the gradients flowing in.
struct GradientRequest : LayerRequest {
  Tensor gradOutput;                             // dLoss/d(output); empty = zeros
  std::map<std::string, Tensor> gradFinalStates; // by state name, [L*D, B, F]; absent = zeros
};

struct GradientResult {
  LayerResult forward;
  TensorMap gradients; // as GradientProgram::backward
};

// Builds, runs forward and backward in one go.
GradientResult runGradients(const ir::Cell& cell, const GradientRequest& request,
                            const LayerOptions& options);

// The name an initial state's gradient has among the gradients.
std::string initialStateGradientName(const std::string& state);

} // namespace rnnc

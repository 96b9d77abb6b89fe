// Backpropagation through time for whole layers (issue 14): stacked, bidirectional, variable
// length, batch_first, any cell the autodiff pass differentiates.
//
// Per layer and direction, two cells derived from the bound cell (passes/Autodiff.h) run
// through the same executors as inference (the JIT or the interpreter) and the same direction
// runner (sorting, packing, per-sequence reversal):
//   - the training forward, whose output carries the states entering each step: all the
//     backward keeps (as cuDNN's reserve space keeps h and c per step);
//   - the backward step, run backwards in time from each sequence's own end (its inputs, the
//     forward's states and the output gradients, are all known before it starts), whose
//     per-step output holds the input gradients and the factors of the parameter gradients.
// Parameter gradients are then a few large products over all rows: dW = sum_t g_t^T a_t as one
// GEMM, vectors as column sums, never per step.
#pragma once

#include "runtime/LayerRunner.h"

#include <map>
#include <string>

namespace rnnc {

struct GradientRequest {
  const TensorMap* weights = nullptr;
  std::string weightsSource = "weights";
  Tensor input;                                // [T, B, I] (or [B, T, I] with batchFirst)
  std::map<std::string, Tensor> sideInputs;    // as in LayerRequest
  std::map<std::string, Tensor> initialStates; // state name -> [L*D, B, F]; absent = zeros
  std::optional<Int64Array> lengths;           // [B], any order, each in [1, T]
  // dLoss/d(output), laid out as the output; empty = zeros.
  Tensor gradOutput;
  // dLoss/d(final state) by state name, [L*D, B, F]; absent = zeros.
  std::map<std::string, Tensor> gradFinalStates;
};

struct GradientResult {
  LayerResult forward;
  // dLoss/d(each parameter) under its name in the weights (weight_ih_l0, bias_hh_l1_reverse,
  // ...; none for biases a bias-free file lacks), dLoss/d(input) as "input" (each side input
  // under its name), and dLoss/d(initial state) as "h0", "c0" (any other state: its name),
  // [L*D, B, F]. The loss is sum(output * gradOutput) + sum(final state * its gradient).
  TensorMap gradients;
};

GradientResult runGradients(const ir::Cell& cell, const GradientRequest& request,
                            const LayerOptions& options);

// The name an initial state's gradient has in GradientResult::gradients.
std::string initialStateGradientName(const std::string& state);

} // namespace rnnc

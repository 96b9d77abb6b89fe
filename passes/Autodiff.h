// Reverse-mode differentiation of a cell's step (issue 14): from the forward cell, a backward
// cell in the same IR that one time step of backpropagation through time runs, so that it goes
// through the same passes, interpreter and code generator as any cell.
//
// The backward cell, for a forward cell with inputs X, states S and output y:
//   inputs   X (this step's inputs), S (the states entering this step, kept by the forward),
//            `grad.output` (dLoss/dy of this step) and `kept.<k>`: the forward values the
//            training forward kept at this step (see ForwardValues)
//   states   `grad.<s>` for each s of S: dLoss/d(the next value of s made by this step); its
//            update is dLoss/d(s entering this step), which the step before receives
//   params   the forward's
//   output   the per-step gradients side by side, described by `segments`: dLoss/dX, and what the
//            sequence runner reduces over all rows (every step and sequence) into parameter
//            gradients: for a product by a parameter W, the gradient of its result `g` and its
//            operand `a` (dW = g^T a for linear, a^T g for matmul, one GEMM over all rows); for a
//            parameter vector read elementwise, its per-row contribution (summed over the rows).
//            Each value is placed once (an LSTM's gate gradients serve W_ih, W_hh and both
//            biases), and an operand that is an input of the backward cell (x, h) is not placed
//            at all: the runner reads it where it gave it.
//
// What the forward keeps (like cuDNN's reserve space): by default every value the gradients
// read that depends on a product, so that the backward step runs none of the forward's
// products again; an LSTM keeps its four activated gates besides the states entering each step
// (h and c), as cuDNN keeps the gates and c. Recompute keeps only the states entering each step
// and runs the forward step again inside the backward one (the passes hoist what does not
// depend on the states): half the memory, a third more matrix work.
#pragma once

#include "ir/Cell.h"

#include <memory>
#include <string>
#include <vector>

namespace rnnc::passes {

struct GradientSegment {
  enum class Kind {
    Input,         // dLoss/d(input `name`), [B, F] (what its elementwise uses contribute)
    InputByLinear, // linear(x = input `name`, W = `weight`): g here; the runner adds g W to dx
    InputByMatMul, // matmul(x = input `name`, W = `weight`): the runner adds g W^T to dx
    LinearWeight,  // linear(a, W = `name`): `operand` columns hold a, `columns` hold g
    MatMulWeight,  // matmul(a, W = `name`): the same, dW = a^T g
    VectorWeight,  // per-row contributions to dLoss/d(parameter `name`), summed over rows
  };
  Kind kind;
  std::string name;
  ir::Dim offset, width; // the segment's columns in the backward cell's output
  // LinearWeight and MatMulWeight: where a is: the input of the backward cell of this name, or
  // (empty name) these columns of the output.
  std::string operandInput;
  std::string weight; // InputByLinear, InputByMatMul: the weight's name
  ir::Dim operandOffset, operandWidth;
};

// A product's weight made of parameters alone (say linear(h, w * 0.5), linear(x, w1 + w2)): a
// matrix without the batch dimension, which every row reads. Its segments name it `name`
// (kDerivedPrefix, then a number) where they would name a parameter: the runner takes its
// gradient over all rows as a parameter's, then on through the elementwise operations that made
// it to the parameters (runtime/layers/ParameterChain.h).
struct DerivedWeight {
  std::string name;
  size_t position; // the value's instruction in the forward (pre block, then step block)
};

struct BackwardCell {
  std::unique_ptr<ir::Cell> cell;
  std::vector<GradientSegment> segments;
  std::vector<DerivedWeight> derivedWeights;
  // The kept forward values, by position in the forward's instructions (pre block, then step
  // block); the backward cell's last inputs, `kept.0`, `kept.1`, ..., read them in this order.
  std::vector<size_t> kept;
};

inline constexpr const char* kGradPrefix = "grad.";       // grad.output, grad.h, grad.c, ...
inline constexpr const char* kKeptPrefix = "kept.";       // the kept forward values
inline constexpr const char* kDerivedPrefix = "derived."; // weights made of parameters

// The operations a weight made of parameters may go through and still train: what the runner
// differentiates on whole matrices (elementwise, with scalars and rows broadcast; column slices
// and concatenations), checked when the backward is derived.
bool differentiableInWeights(ir::Op op);

enum class ForwardValues { Keep, Recompute };

// Throws UserError naming the op for what cannot be differentiated. `dropout` is the identity
// here (inference); training makes its masks explicit first (passes/TrainingDropout.h), and a
// dropout_mask is kept like a product, under either policy: the backward reads the forward's
// masks and draws none.
BackwardCell deriveBackward(const ir::Cell& forward, ForwardValues policy = ForwardValues::Keep);

// The training forward: `forward` whose output holds, side by side, each distinct value the
// backward reads from the forward: its output, the value each state leaves a step with, and the
// values `backward` keeps. A value that is already there is not repeated: an LSTM's h leaves
// the step as its output, a tanh RNN keeps its output. The state entering a step is the one the
// step before left (before a sequence's first step, the initial state): the runner reads it
// there, so the forward writes no copy of it (what cuDNN's reserve space keeps: the gates and c).
struct TrainingForward {
  std::unique_ptr<ir::Cell> cell;
  // Where, among the output's columns, each state's next value is (per state, in state order)
  // and each kept value (in BackwardCell::kept order); the forward's output is at column 0.
  std::vector<ir::Dim> stateOffsets, keptOffsets;
  ir::Dim width; // the output's columns
};
TrainingForward trainingForward(const ir::Cell& forward, const BackwardCell& backward);

} // namespace rnnc::passes

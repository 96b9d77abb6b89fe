// The weights a cell makes of its parameters alone (say linear(h, w * 0.5), linear(x, w1 + w2),
// linear(h, tanh(v) * s)), for training: their values, and the gradients of the parameters they
// are made of given the weight's (passes/Autodiff.h, DerivedWeight). Every row reads such a
// weight, so its gradient is a product's over all rows, as a parameter's is; what made it is a
// few elementwise operations on whole matrices (passes::differentiableInWeights), differentiated
// here once per backward rather than per row.
#pragma once

#include "ir/Cell.h"
#include "runtime/data/Tensor.h"

#include <map>
#include <vector>

namespace rnnc {

class ParameterChain {
public:
  // `cell` (sizes bound) and `params` (cell.params' order) must outlive the chain.
  ParameterChain(const ir::Cell& cell, const std::vector<Tensor>& params);

  // The value of the instruction at `position` (pre block, then step block), which reads
  // parameters and constants alone; computed once.
  const Tensor& value(size_t position);

  // Adds dLoss/d(each parameter) into paramGradients (cell.params' order, each the parameter's
  // shape), given dLoss/d(the value at `position`).
  void backpropagate(size_t position, const Tensor& gradient, std::vector<Tensor>& paramGradients);

private:
  const Tensor& valueOf(const ir::Value* v);

  const ir::Cell& cell_;
  const std::vector<Tensor>& params_;
  std::vector<const ir::Instr*> instrs_;          // by position
  std::map<const ir::Value*, size_t> positions_;  // instruction results -> position
  std::map<const ir::Value*, size_t> paramIndex_; // parameters -> index
  std::map<size_t, Tensor> values_;               // computed so far
};

} // namespace rnnc

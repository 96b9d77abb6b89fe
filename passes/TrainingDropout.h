// Dropout inside a cell, made explicit for training: each `dropout(x, p)` becomes
// `mul(x, dropout_mask(x, p, stream = k))`, k counting the cell's dropouts in order (pre block,
// then step block). The mask is then a value like any other: the JIT and the interpreter draw it
// the same way (runtime/exec/Hash.h), and the autodiff pass keeps it for the backward, which
// multiplies the gradient by the very mask the forward drew (dLoss/dx = dLoss/dy * mask).
// Inference leaves `dropout` alone: there it is the identity.
#pragma once

#include "ir/Cell.h"

#include <vector>

namespace rnnc::passes {

// A dropout of a value without the batch dimension (of parameters alone) has no rows to draw a
// mask for and stays (lowerParameterDropout below takes it on). Returns whether anything changed.
bool lowerTrainingDropout(ir::Cell& cell);

// After lowerTrainingDropout, in a layer's training run: each dropout of parameters alone becomes
// x times a mask that every row and step shares, as AWD-LSTM drops a recurrent weight (a mask
// per run, DropConnect): a new parameter `dropout_mask.<stream>` of x's shape, for the runner to
// fill (runtime/exec/Hash.h: row r of x's rows in the dropout's stream, the seed of the run).
// The product it feeds is then one by a weight made of parameters, which trains.
struct ParameterDropout {
  const ir::Value* mask; // the new parameter
  int stream;            // the dropout's number, as lowerTrainingDropout counts them
  double p;
};
std::vector<ParameterDropout> lowerParameterDropout(ir::Cell& cell);

} // namespace rnnc::passes

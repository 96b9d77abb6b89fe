// Dropout inside a cell, made explicit for training: each `dropout(x, p)` becomes
// `mul(x, dropout_mask(x, p, stream = k))`, k counting the cell's dropouts in order (pre block,
// then step block). The mask is then a value like any other: the JIT and the interpreter draw it
// the same way (runtime/exec/Hash.h), and the autodiff pass keeps it for the backward, which
// multiplies the gradient by the very mask the forward drew (dLoss/dx = dLoss/dy * mask).
// Inference leaves `dropout` alone: there it is the identity.
#pragma once

#include "ir/Cell.h"

namespace rnnc::passes {

// A dropout of a value without the batch dimension (of parameters alone) has no rows to draw a
// mask for and stays: the interpreter draws its masks per step (Interpreter.cpp), and such a
// cell trains on it, forward only. Returns whether anything changed.
bool lowerTrainingDropout(ir::Cell& cell);

} // namespace rnnc::passes

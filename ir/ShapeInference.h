// The shape rules of every op, in one place. Used by the builder when a node is made, by the IR
// parser to check the shape written in a dump, and by the verifier after every pass.
#pragma once

#include "ir/Cell.h"
#include "ir/Error.h"

namespace rnnc::ir {

// A shape rule was broken. The message names the op and the operand shapes but no source
// location: the frontend and the IR parser add theirs.
class ShapeError : public UserError {
public:
  using UserError::UserError;
};

// The result shape of `op` on operands of these shapes. For Slice, `sliceSize` is the length of
// the slice (the result's last dimension). Throws ShapeError.
Shape inferShape(Op op, const std::vector<const Shape*>& operands, const Attrs& attrs,
                 const Dim* sliceSize = nullptr);

// The shape of an elementwise op's result: operands of rank 0 ([]), 1 ([F]) and 2 ([M, F]) are
// broadcast against each other from the right; dimensions must otherwise be equal.
std::optional<Shape> broadcastShapes(const Shape& a, const Shape& b);

} // namespace rnnc::ir

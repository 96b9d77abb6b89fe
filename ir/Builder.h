// Makes instructions at the end of a block, checking operand shapes as each node is made (as
// Halide's Add::make does). A shape error surfaces as ir::ShapeError for the caller to locate.
#pragma once

#include "ir/Cell.h"

namespace rnnc::ir {

class Builder {
public:
  Builder(Cell& cell, Block& block) : cell_(cell), block_(&block) {}

  void setBlock(Block& block) { block_ = &block; }

  // Any op but Slice (whose result size is not implied by its operand).
  Value* create(Op op, std::vector<Value*> operands, Attrs attrs = {});
  Value* slice(Value* operand, Dim offset, Dim size);
  Value* constant(double value);

  // Inserts the instruction at `position` in the current block instead of appending.
  Value* insert(size_t position, Op op, std::vector<Value*> operands, Attrs attrs = {});

  Cell& cell() { return cell_; }

private:
  Value* make(size_t position, Op op, std::vector<Value*> operands, Attrs attrs, const Dim* size);
  Cell& cell_;
  Block* block_;
};

} // namespace rnnc::ir

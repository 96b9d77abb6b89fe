#include "passes/SinkSlices.h"

#include "ir/Builder.h"
#include "passes/DeadCodeElimination.h"

#include <algorithm>

namespace rnnc::passes {
namespace {

bool onlySliced(const ir::Cell& cell, const ir::Value* value) {
  int slices = 0;
  for (const ir::Block* block : {&cell.pre, &cell.step})
    for (const auto& instr : *block)
      for (const ir::Value* operand : instr->operands)
        if (operand == value) {
          if (instr->op != ir::Op::Slice)
            return false;
          ++slices;
        }
  return slices == ir::countUses(cell, value); // not an update or the output either
}

} // namespace

bool sinkSlice(ir::Cell& cell, ir::Block& block, size_t index) {
  ir::Instr& slice = *block[index];
  if (slice.op != ir::Op::Slice || slice.operands[0]->isArgument())
    return false;
  ir::Instr& source = *slice.operands[0]->def;
  ir::Builder builder(cell, block);
  const ir::Dim& size = slice.result.shape.back();
  if (source.op == ir::Op::Slice) { // slices compose across blocks: offsets just add up
    ir::Value* merged =
        builder.slice(source.operands[0], source.attrs.offset + slice.attrs.offset, size);
    // builder.slice appends; move the new slice in front of its only user.
    std::unique_ptr<ir::Instr> made = std::move(block.back());
    block.pop_back();
    block.insert(block.begin() + static_cast<std::ptrdiff_t>(index), std::move(made));
    ir::replaceAllUses(cell, &slice.result, merged);
    return true;
  }
  // Only within one block: sinking a step slice into a pre value would pull hoisted work back
  // into the loop. A slice of a pre value is just an offset read.
  bool sameBlock = std::any_of(block.begin(), block.end(),
                               [&](const auto& instr) { return instr.get() == &source; });
  if (!sameBlock || !ir::isElementwise(source.op) || source.op == ir::Op::Const ||
      !onlySliced(cell, &source.result))
    return false;
  std::vector<ir::Value*> operands;
  size_t at = index;
  for (ir::Value* operand : source.operands) {
    if (operand->shape.empty()) { // a broadcast scalar is the same in every slice
      operands.push_back(operand);
      continue;
    }
    ir::Value* part = builder.slice(operand, slice.attrs.offset, size);
    std::unique_ptr<ir::Instr> made = std::move(block.back());
    block.pop_back();
    block.insert(block.begin() + static_cast<std::ptrdiff_t>(at++), std::move(made));
    operands.push_back(part);
  }
  ir::Value* sliced = builder.insert(at, source.op, operands, source.attrs);
  ir::replaceAllUses(cell, &slice.result, sliced);
  return true;
}

bool sinkSlices(ir::Cell& cell) {
  bool changed = false;
  for (ir::Block* block : {&cell.pre, &cell.step})
    for (size_t i = 0; i < block->size(); ++i)
      if (sinkSlice(cell, *block, i)) {
        changed = true;
        eliminateDeadCode(cell);     // the old slice (and maybe its source) is dead now
        i = static_cast<size_t>(-1); // indices moved: start over (the loop's ++i makes it 0)
      }
  return changed;
}

} // namespace rnnc::passes

#include "passes/MergeGates.h"

#include "ir/Builder.h"
#include "passes/DeadCodeElimination.h"

#include <algorithm>
#include <map>

namespace rnnc::passes {
namespace {

using ir::Op;

// The position just after `value`'s definition in `block`, or 0 if it is defined elsewhere
// (an argument, or a pre value read by the step block).
size_t readyAt(const ir::Block& block, const ir::Value* value) {
  for (size_t i = 0; i < block.size(); ++i)
    if (&block[i]->result == value)
      return i + 1;
  return 0;
}

bool inBlock(const ir::Block& block, const ir::Value* value) {
  return readyAt(block, value) != 0;
}

// Merges one group of products in `block` (all of `op`, all reading `operand`). Returns whether
// it rewrote.
bool mergeGroup(ir::Cell& cell, ir::Block& block, Op op, const std::vector<ir::Instr*>& group) {
  ir::Value* operand = group[0]->operands[0];
  std::vector<ir::Value*> weights;
  for (ir::Instr* product : group)
    weights.push_back(product->operands[1]);
  // Where every weight and the operand exist; the merged product goes there, so it must not be
  // later than the first product it replaces.
  size_t first = block.size();
  for (ir::Instr* product : group)
    first = std::min(
        first, static_cast<size_t>(std::find_if(block.begin(), block.end(),
                                                [&](const auto& i) { return i.get() == product; }) -
                                   block.begin()));
  size_t at = readyAt(block, operand);
  for (ir::Value* w : weights)
    at = std::max(at, readyAt(block, w));
  if (at > first)
    return false;

  // The stacked weight: in the pre block when the products are in the step block (it would
  // otherwise be rebuilt every step), else just before the merged product.
  bool inStep = &block == &cell.step;
  bool weightsReadyBeforeStep =
      std::none_of(weights.begin(), weights.end(), [&](ir::Value* w) { return inBlock(block, w); });
  if (inStep && !weightsReadyBeforeStep)
    return false;
  ir::Block& weightBlock = inStep ? cell.pre : block;
  size_t weightAt = inStep ? cell.pre.size() : at;
  ir::Builder weightBuilder(cell, weightBlock);
  ir::Value* stacked =
      weightBuilder.insert(weightAt, op == Op::Linear ? Op::Stack : Op::Concat, weights);
  if (!inStep)
    ++at;

  ir::Builder builder(cell, block);
  ir::Value* merged = builder.insert(at++, op, {operand, stacked});
  ir::Dim offset;
  for (ir::Instr* product : group) {
    const ir::Dim& size = product->result.shape.back();
    ir::Value* part = builder.slice(merged, offset, size);
    // builder.slice appends: move it next to the merged product.
    std::unique_ptr<ir::Instr> made = std::move(block.back());
    block.pop_back();
    block.insert(block.begin() + static_cast<std::ptrdiff_t>(at++), std::move(made));
    ir::replaceAllUses(cell, &product->result, part);
    offset = offset + size;
  }
  return true;
}

bool mergeBlock(ir::Cell& cell, ir::Block& block) {
  // Products grouped by (op, operand), in program order.
  std::map<std::pair<Op, const ir::Value*>, std::vector<ir::Instr*>> groups;
  std::vector<std::pair<Op, const ir::Value*>> order;
  for (const auto& instr : block) {
    if (!ir::isMatrixProduct(instr->op))
      continue;
    auto key = std::make_pair(instr->op, static_cast<const ir::Value*>(instr->operands[0]));
    if (!groups.count(key))
      order.push_back(key);
    groups[key].push_back(instr.get());
  }
  bool changed = false;
  for (const auto& key : order)
    if (groups[key].size() > 1)
      changed |= mergeGroup(cell, block, key.first, groups[key]);
  return changed;
}

} // namespace

bool mergeGates(ir::Cell& cell) {
  bool changed = mergeBlock(cell, cell.pre);
  changed |= mergeBlock(cell, cell.step);
  if (changed)
    eliminateDeadCode(cell);
  return changed;
}

} // namespace rnnc::passes

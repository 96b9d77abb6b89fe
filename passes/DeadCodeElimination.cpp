#include "passes/DeadCodeElimination.h"

namespace rnnc::passes {

bool eliminateDeadCode(ir::Cell& cell) {
  ir::ValueSet live(cell.pre.size() + cell.step.size());
  for (const ir::StateUpdate& update : cell.updates)
    live.insert(update.next);
  live.insert(cell.output);
  bool changed = false;
  // Walk backwards so that an instruction's operands are marked before they are visited; the
  // step block reads pre results, so it goes first.
  for (ir::Block* block : {&cell.step, &cell.pre}) {
    for (auto it = block->rbegin(); it != block->rend(); ++it) {
      if (!live.contains(&(*it)->result))
        continue;
      for (const ir::Value* operand : (*it)->operands)
        live.insert(operand);
    }
    size_t before = block->size();
    std::erase_if(*block, [&](const auto& instr) { return !live.contains(&instr->result); });
    changed |= block->size() != before;
  }
  return changed;
}

} // namespace rnnc::passes

#include "passes/HoistParameters.h"

#include "passes/Dependence.h"

#include <algorithm>

namespace rnnc::passes {

bool hoistParameters(ir::Cell& cell) {
  const DependenceMap dependence(cell);
  ir::Block& step = cell.step;
  ir::ValueMap<size_t> indexOf(cell.step.size());
  // Values made of parameters and constants; a constant alone is not worth a value in `pre`.
  std::vector<bool> hoist(step.size(), false);
  for (size_t i = 0; i < step.size(); ++i) {
    const ir::Instr& instr = *step[i];
    indexOf[&instr.result] = i;
    hoist[i] = instr.op != ir::Op::Const && !instr.result.isBatched() &&
               dependence(&instr.result) == Dependence::ParamsOnly;
  }
  // The constants a hoisted value reads go with it (operands come earlier: walk backwards).
  for (size_t i = step.size(); i-- > 0;)
    if (hoist[i])
      for (const ir::Value* operand : step[i]->operands)
        if (const size_t* index = indexOf.find(operand))
          hoist[*index] = true;
  if (std::none_of(hoist.begin(), hoist.end(), [](bool h) { return h; }))
    return false;
  // In program order, so that every hoisted value's operands stay defined before it.
  ir::Block kept;
  for (size_t i = 0; i < step.size(); ++i)
    (hoist[i] ? cell.pre : kept).push_back(std::move(step[i]));
  step = std::move(kept);
  return true;
}

} // namespace rnnc::passes

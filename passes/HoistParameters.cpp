#include "passes/HoistParameters.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace rnnc::passes {

bool hoistParameters(ir::Cell& cell) {
  // Values made of parameters and constants: the parameters, then whatever reads only them.
  std::unordered_set<const ir::Value*> madeOfParameters;
  for (const auto& param : cell.params)
    madeOfParameters.insert(param.get());
  auto allMadeOfParameters = [&](const ir::Instr& instr) {
    return std::all_of(instr.operands.begin(), instr.operands.end(),
                       [&](const ir::Value* v) { return madeOfParameters.count(v) > 0; });
  };
  for (const auto& instr : cell.pre)
    if (allMadeOfParameters(*instr))
      madeOfParameters.insert(&instr->result);

  ir::Block& step = cell.step;
  std::unordered_map<const ir::Value*, size_t> indexOf;
  std::vector<bool> hoist(step.size(), false);
  // What reads a parameter, directly or through values hoisted before it (a constant alone is
  // not worth a value of its own in `pre`).
  std::unordered_set<const ir::Value*> readsParameters;
  for (const auto& param : cell.params)
    readsParameters.insert(param.get());
  for (const auto& instr : cell.pre)
    if (madeOfParameters.count(&instr->result))
      readsParameters.insert(&instr->result);
  for (size_t i = 0; i < step.size(); ++i) {
    const ir::Instr& instr = *step[i];
    indexOf[&instr.result] = i;
    if (instr.result.isBatched() || !allMadeOfParameters(instr))
      continue;
    madeOfParameters.insert(&instr.result);
    if (std::any_of(instr.operands.begin(), instr.operands.end(),
                    [&](const ir::Value* v) { return readsParameters.count(v) > 0; })) {
      readsParameters.insert(&instr.result);
      hoist[i] = true;
    }
  }
  // The constants a hoisted value reads go with it (operands come earlier: walk backwards).
  for (size_t i = step.size(); i-- > 0;)
    if (hoist[i])
      for (const ir::Value* operand : step[i]->operands)
        if (auto it = indexOf.find(operand); it != indexOf.end())
          hoist[it->second] = true;
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

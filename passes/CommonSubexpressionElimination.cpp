#include "passes/CommonSubexpressionElimination.h"

#include "ir/Printer.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace rnnc::passes {
namespace {

// A key that is equal for instructions computing the same value. Operands are identified by a
// stable number (arguments first, then results in order) so the key is deterministic.
using Key = std::tuple<int, std::vector<int>, std::string, std::string>;

std::string attrText(const ir::Instr& instr) {
  const ir::Attrs& a = instr.attrs;
  return ir::formatNumber(a.value) + "," + ir::formatNumber(a.lo) + "," + ir::formatNumber(a.hi) +
         "," + ir::formatNumber(a.stream) + "," + a.offset.str();
}

} // namespace

bool eliminateCommonSubexpressions(ir::Cell& cell) {
  std::unordered_map<const ir::Value*, int> number;
  for (ir::ArgKind kind : {ir::ArgKind::Input, ir::ArgKind::State, ir::ArgKind::Param})
    for (const auto& arg : cell.arguments(kind))
      number[arg.get()] = static_cast<int>(number.size());

  // The pre block is visited first, and a step instruction may reuse a pre result, never the
  // reverse, so values stay defined before their uses.
  std::map<Key, ir::Value*> seen;
  bool changed = false;
  for (ir::Block* block : {&cell.pre, &cell.step})
    for (const auto& instr : *block) {
      std::vector<int> operands;
      for (const ir::Value* operand : instr->operands)
        operands.push_back(number.at(operand));
      if (ir::isCommutative(instr->op))
        std::sort(operands.begin(), operands.end());
      Key key{static_cast<int>(instr->op), operands, attrText(*instr),
              ir::shapeStr(instr->result.shape)};
      auto [it, inserted] = seen.emplace(key, &instr->result);
      if (inserted) {
        number[&instr->result] = static_cast<int>(number.size());
        continue;
      }
      // Uses of the duplicate now read the first one; give the duplicate the same number so
      // instructions built on either are recognised as equal too.
      number[&instr->result] = number.at(it->second);
      ir::replaceAllUses(cell, &instr->result, it->second);
      changed = true;
    }
  return changed;
}

} // namespace rnnc::passes

// How far each value of a cell depends on the step: on parameters and constants only, also on
// the inputs, or on the recurrent state. What premultiply and hoist-parameters may move out of
// the time loop follows from it.
#pragma once

#include "ir/Cell.h"

#include <algorithm>
#include <unordered_map>

namespace rnnc::passes {

// Ordered: a value depends as far as its furthest operand. Only State must stay in the loop.
enum class Dependence { ParamsOnly = 0, Inputs = 1, State = 2 };

class DependenceMap {
public:
  explicit DependenceMap(const ir::Cell& cell) : of_(ir::valueCount(cell)) {
    for (const auto& v : cell.inputs)
      of_[v.get()] = Dependence::Inputs;
    for (const auto& v : cell.states)
      of_[v.get()] = Dependence::State;
    for (const auto& v : cell.params)
      of_[v.get()] = Dependence::ParamsOnly;
    for (const ir::Block* block : {&cell.pre, &cell.step})
      for (const auto& instr : *block)
        update(*instr);
  }
  // (Re)computes a new or rewritten instruction's dependence from its operands'.
  void update(const ir::Instr& instr) {
    Dependence d = Dependence::ParamsOnly;
    for (const ir::Value* operand : instr.operands)
      d = std::max(d, of_.at(operand));
    of_[&instr.result] = d;
  }
  Dependence operator()(const ir::Value* v) const { return of_.at(v); }

private:
  ir::ValueMap<Dependence> of_;
};

} // namespace rnnc::passes

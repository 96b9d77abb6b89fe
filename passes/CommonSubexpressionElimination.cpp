#include "passes/CommonSubexpressionElimination.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

namespace rnnc::passes {
namespace {

// What makes two instructions compute the same value: the op, the operands (by a stable number:
// arguments first, then results in order; sorted for a commutative op), the attributes and the
// result's shape. Numbers compare by their bits, every NaN of a sign alike (as their printed
// text did, which this replaced: formatting five doubles per instruction was a quarter of the
// pass).
struct Key {
  ir::Op op;
  std::vector<int> operands;
  std::array<uint64_t, 4> numbers;
  const ir::Instr* instr; // its offset and shape

  bool operator==(const Key& other) const {
    return op == other.op && operands == other.operands && numbers == other.numbers &&
           instr->attrs.offset == other.instr->attrs.offset &&
           instr->result.shape == other.instr->result.shape;
  }
};

uint64_t numberBits(double value) {
  if (std::isnan(value))
    return std::signbit(value) ? ~uint64_t{0} : ~uint64_t{0} - 1;
  return std::bit_cast<uint64_t>(value);
}

struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t h = std::hash<int>()(static_cast<int>(key.op));
    auto mix = [&](uint64_t v) {
      h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    for (int operand : key.operands)
      mix(static_cast<uint64_t>(operand));
    for (uint64_t bits : key.numbers)
      mix(bits);
    return h;
  }
};

} // namespace

bool eliminateCommonSubexpressions(ir::Cell& cell) {
  ir::ValueMap<int> number(ir::valueCount(cell));
  for (ir::ArgKind kind : {ir::ArgKind::Input, ir::ArgKind::State, ir::ArgKind::Param})
    for (const auto& arg : cell.arguments(kind))
      number[arg.get()] = static_cast<int>(number.size());

  // The pre block is visited first, and a step instruction may reuse a pre result, never the
  // reverse, so values stay defined before their uses.
  std::unordered_map<Key, ir::Value*, KeyHash> seen;
  bool changed = false;
  for (ir::Block* block : {&cell.pre, &cell.step})
    for (const auto& instr : *block) {
      std::vector<int> operands;
      operands.reserve(instr->operands.size());
      for (const ir::Value* operand : instr->operands)
        operands.push_back(number.at(operand));
      if (ir::isCommutative(instr->op))
        std::sort(operands.begin(), operands.end());
      const ir::Attrs& a = instr->attrs;
      Key key{instr->op,
              std::move(operands),
              {numberBits(a.value), numberBits(a.lo), numberBits(a.hi), numberBits(a.stream)},
              instr.get()};
      auto [it, inserted] = seen.emplace(std::move(key), &instr->result);
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

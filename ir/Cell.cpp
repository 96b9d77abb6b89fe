#include "ir/Cell.h"

#include "ir/Error.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

namespace rnnc::ir {

int64_t columnsOf(const Value* value) {
  if (value->shape.empty())
    return 1;
  const Dim& last = value->shape.back();
  RNNC_INTERNAL_CHECK(last.isConstant(), "unbound size in " + shapeStr(value->shape));
  return last.constantValue();
}

int64_t fixedRowsOf(const Value* value) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < value->shape.size(); ++i) {
    RNNC_INTERNAL_CHECK(value->shape[i].isConstant(), "unbound size in " + shapeStr(value->shape));
    rows *= value->shape[i].constantValue();
  }
  return rows;
}

std::span<const AttrField> attrFields(AttrKind kind) {
  static constexpr AttrField kValue[] = {{"value", &Attrs::value}};
  static constexpr AttrField kOffset[] = {{"offset", nullptr}};
  static constexpr AttrField kRange[] = {{"lo", &Attrs::lo}, {"hi", &Attrs::hi}};
  static constexpr AttrField kProb[] = {{"p", &Attrs::value}};
  static constexpr AttrField kEps[] = {{"eps", &Attrs::value}};
  static constexpr AttrField kMask[] = {{"p", &Attrs::value}, {"stream", &Attrs::stream}};
  switch (kind) {
  case AttrKind::None:
    return {};
  case AttrKind::Value:
    return kValue;
  case AttrKind::Offset:
    return kOffset;
  case AttrKind::Range:
    return kRange;
  case AttrKind::Prob:
    return kProb;
  case AttrKind::Eps:
    return kEps;
  case AttrKind::Mask:
    return kMask;
  }
  return {};
}

} // namespace rnnc::ir

namespace rnnc::ir {

std::string_view argKindName(ArgKind kind) {
  switch (kind) {
  case ArgKind::Input:
    return "input";
  case ArgKind::State:
    return "state";
  case ArgKind::Param:
    return "param";
  }
  return "?";
}

Instr::Instr(Op op, std::vector<Value*> operands, Attrs attrs, Shape shape)
    : op(op), operands(std::move(operands)), attrs(std::move(attrs)) {
  result.shape = std::move(shape);
  result.def = this;
}

bool isFusible(Op op) {
  return isElementwise(op) || isView(op) || op == Op::LayerNorm;
}

const std::vector<std::unique_ptr<Value>>& Cell::arguments(ArgKind kind) const {
  switch (kind) {
  case ArgKind::Input:
    return inputs;
  case ArgKind::State:
    return states;
  case ArgKind::Param:
    return params;
  }
  RNNC_INTERNAL_CHECK(false, "bad argument kind");
}

Value* Cell::addArgument(ArgKind kind, const std::string& argName, Shape shape) {
  auto value = std::make_unique<Value>();
  value->name = argName;
  value->argKind = kind;
  value->shape = std::move(shape);
  Value* raw = value.get();
  const_cast<std::vector<std::unique_ptr<Value>>&>(arguments(kind)).push_back(std::move(value));
  return raw;
}

Value* Cell::findArgument(const std::string& argName) const {
  for (ArgKind kind : {ArgKind::Input, ArgKind::State, ArgKind::Param})
    for (const auto& arg : arguments(kind))
      if (arg->name == argName)
        return arg.get();
  return nullptr;
}

const StateUpdate* Cell::updateOf(const Value* state) const {
  for (const StateUpdate& update : updates)
    if (update.state == state)
      return &update;
  return nullptr;
}

void Cell::bindSizes(const SizeMap& bindings) {
  for (const auto& [sizeName, value] : bindings) {
    if (std::find(sizeNames.begin(), sizeNames.end(), sizeName) == sizeNames.end()) {
      std::string known;
      for (const auto& n : sizeNames)
        known += (known.empty() ? "" : ", ") + n;
      throw UserError("cell '" + name + "' has no size named '" + sizeName +
                      "' (its sizes: " + (known.empty() ? "none" : known) + ")");
    }
    if (value <= 0)
      throw UserError("size '" + sizeName + "' must be positive, got " + std::to_string(value));
    sizes[sizeName] = value;
  }
  for (ArgKind kind : {ArgKind::Input, ArgKind::State, ArgKind::Param})
    for (const auto& arg : arguments(kind))
      arg->shape = substituteShape(arg->shape, bindings);
  for (Block* block : {&pre, &step})
    for (const auto& instr : *block) {
      instr->result.shape = substituteShape(instr->result.shape, bindings);
      instr->attrs.offset = instr->attrs.offset.substitute(bindings);
    }
}

std::unique_ptr<Cell> Cell::clone() const {
  auto copy = std::make_unique<Cell>();
  copy->name = name;
  copy->sizeNames = sizeNames;
  copy->sizes = sizes;
  ValueMap<Value*> map(valueCount(*this));
  for (ArgKind kind : {ArgKind::Input, ArgKind::State, ArgKind::Param})
    for (const auto& arg : arguments(kind))
      map[arg.get()] = copy->addArgument(kind, arg->name, arg->shape);
  auto mapped = [&](Value* v) -> Value* {
    Value* const* found = map.find(v);
    RNNC_INTERNAL_CHECK(found, "clone: operand defined outside the cell");
    return *found;
  };
  for (auto [from, to] : {std::pair{&pre, &copy->pre}, std::pair{&step, &copy->step}})
    for (const auto& instr : *from) {
      std::vector<Value*> operands;
      for (Value* operand : instr->operands)
        operands.push_back(mapped(operand));
      auto newInstr = std::make_unique<Instr>(instr->op, std::move(operands), instr->attrs,
                                              instr->result.shape);
      newInstr->kernel = instr->kernel;
      map[&instr->result] = &newInstr->result;
      to->push_back(std::move(newInstr));
    }
  for (const StateUpdate& update : updates)
    copy->updates.push_back({mapped(update.state), mapped(update.next)});
  copy->output = output ? mapped(output) : nullptr;
  return copy;
}

void replaceAllUses(Cell& cell, Value* from, Value* to) {
  for (Block* block : {&cell.pre, &cell.step})
    for (const auto& instr : *block)
      for (Value*& operand : instr->operands)
        if (operand == from)
          operand = to;
  for (StateUpdate& update : cell.updates)
    if (update.next == from)
      update.next = to;
  if (cell.output == from)
    cell.output = to;
}

bool containsOp(const Cell& cell, Op op) {
  for (const Block* block : {&cell.pre, &cell.step})
    for (const auto& instr : *block)
      if (instr->op == op)
        return true;
  return false;
}

size_t valueCount(const Cell& cell) {
  return cell.inputs.size() + cell.states.size() + cell.params.size() + cell.pre.size() +
         cell.step.size();
}

int countUses(const Cell& cell, const Value* value) {
  int uses = 0;
  for (const Block* block : {&cell.pre, &cell.step})
    for (const auto& instr : *block)
      for (const Value* operand : instr->operands)
        uses += operand == value;
  for (const StateUpdate& update : cell.updates)
    uses += update.next == value;
  uses += cell.output == value;
  return uses;
}

ValueMap<int> useCounts(const Cell& cell) {
  ValueMap<int> uses(cell.pre.size() + cell.step.size());
  for (const Block* block : {&cell.pre, &cell.step})
    for (const auto& instr : *block)
      for (const Value* operand : instr->operands)
        ++uses[operand];
  for (const StateUpdate& update : cell.updates)
    if (update.next) // a cell still being built may lack one
      ++uses[update.next];
  if (cell.output)
    ++uses[cell.output];
  return uses;
}

bool hasPackableWeights(const Cell& cell, const Instr& product) {
  if (!isMatrixProduct(product.op) || product.operands.size() != 2)
    return false;
  const Value* x = product.operands[0];
  const Value* w = product.operands[1];
  if (!x->isBatched() || x->shape.size() != 2 || w->isBatched() || w->shape.size() != 2)
    return false;
  if (w->isArgument())
    return w->argKind == ArgKind::Param;
  return std::any_of(cell.pre.begin(), cell.pre.end(),
                     [&](const auto& instr) { return &instr->result == w; });
}

double matrixProductFlopsPerStep(const Cell& cell, int64_t batch) {
  SizeMap sizes = cell.sizes;
  sizes[kBatchSymbol] = batch;
  double flops = 0;
  for (const auto* block : {&cell.pre, &cell.step})
    for (const auto& instr : *block) {
      if (!isMatrixProduct(instr->op) || instr->operands.empty())
        continue;
      const Shape& x = instr->operands[0]->shape;
      const Shape& y = instr->result.shape;
      if (x.size() != 2 || y.size() != 2)
        continue;
      const std::optional<int64_t> m = x[0].evaluate(sizes), k = x[1].evaluate(sizes),
                                   n = y[1].evaluate(sizes);
      if (m && k && n)
        flops += 2.0 * static_cast<double>(*m) * static_cast<double>(*k) * static_cast<double>(*n);
    }
  return flops;
}

} // namespace rnnc::ir

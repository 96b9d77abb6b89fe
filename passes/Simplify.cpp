#include "passes/Simplify.h"

#include "ir/Builder.h"

#include <cmath>
#include <optional>

namespace rnnc::passes {
namespace {

using ir::Op;

std::optional<double> constantOf(const ir::Value* v) {
  if (v->isArgument() || v->def->op != Op::Const)
    return std::nullopt;
  return v->def->attrs.value;
}

// Float arithmetic, as the kernels compute it.
std::optional<double> fold(const ir::Instr& instr, const std::vector<double>& in) {
  auto f = [](double v) { return static_cast<float>(v); };
  const ir::Attrs& a = instr.attrs;
  switch (instr.op) {
  case Op::Add:
    return f(in[0]) + f(in[1]);
  case Op::Sub:
    return f(in[0]) - f(in[1]);
  case Op::Mul:
    return f(in[0]) * f(in[1]);
  case Op::Div:
    return f(in[0]) / f(in[1]);
  case Op::Min:
    return std::isnan(in[0]) || std::isnan(in[1]) ? NAN : std::min(f(in[0]), f(in[1]));
  case Op::Max:
    return std::isnan(in[0]) || std::isnan(in[1]) ? NAN : std::max(f(in[0]), f(in[1]));
  case Op::Neg:
    return -f(in[0]);
  case Op::Sigmoid:
    return 1.0f / (1.0f + std::exp(-f(in[0])));
  case Op::Tanh:
    return std::tanh(f(in[0]));
  case Op::Relu:
    return std::isnan(in[0]) ? NAN : std::max(f(in[0]), 0.0f);
  case Op::Exp:
    return std::exp(f(in[0]));
  case Op::Log:
    return std::log(f(in[0]));
  case Op::Sqrt:
    return std::sqrt(f(in[0]));
  case Op::Clamp:
    return std::isnan(in[0]) ? NAN : std::min(std::max(f(in[0]), f(a.lo)), f(a.hi));
  case Op::Step:
    return std::isnan(in[0]) ? NAN : f(in[0]) > 0 ? 1.0 : 0.0;
  default:
    return std::nullopt; // dropout is random in training; others are not elementwise on scalars
  }
}

// The operand that `instr` reduces to, if it is an identity.
ir::Value* identityOperand(const ir::Instr& instr) {
  const auto& ops = instr.operands;
  auto is = [](const ir::Value* v, double c) { return constantOf(v) == c; };
  auto keepsShape = [&](const ir::Value* v) { return v->shape == instr.result.shape; };
  ir::Value* candidate = nullptr;
  switch (instr.op) {
  case Op::Add:
    candidate = is(ops[1], 0) ? ops[0] : is(ops[0], 0) ? ops[1] : nullptr;
    break;
  case Op::Sub:
    candidate = is(ops[1], 0) ? ops[0] : nullptr;
    break;
  case Op::Mul:
    candidate = is(ops[1], 1) ? ops[0] : is(ops[0], 1) ? ops[1] : nullptr;
    break;
  case Op::Div:
    candidate = is(ops[1], 1) ? ops[0] : nullptr;
    break;
  case Op::Neg:
    if (!ops[0]->isArgument() && ops[0]->def->op == Op::Neg)
      candidate = ops[0]->def->operands[0];
    break;
  case Op::Concat:
    candidate = ops.size() == 1 ? ops[0] : nullptr;
    break;
  case Op::Slice: {
    ir::Value* x = ops[0];
    if (instr.attrs.offset == ir::Dim() && x->shape == instr.result.shape)
      candidate = x;
    // A slice that is exactly one part of a concat reads that part.
    if (!candidate && !x->isArgument() && x->def->op == Op::Concat) {
      ir::Dim start;
      for (ir::Value* part : x->def->operands) {
        if (start == instr.attrs.offset && part->shape == instr.result.shape)
          candidate = part;
        start = start + part->shape.back();
      }
    }
    break;
  }
  default:
    break;
  }
  return candidate && keepsShape(candidate) ? candidate : nullptr;
}

bool simplifyBlock(ir::Cell& cell, ir::Block& block) {
  bool changed = false;
  for (size_t i = 0; i < block.size(); ++i) {
    ir::Instr& instr = *block[i];
    if (ir::Value* same = identityOperand(instr)) {
      ir::replaceAllUses(cell, &instr.result, same);
      changed = true;
      continue;
    }
    if (!ir::isElementwise(instr.op) || instr.op == Op::Const || instr.operands.empty())
      continue;
    std::vector<double> values;
    for (const ir::Value* operand : instr.operands)
      if (auto c = constantOf(operand))
        values.push_back(*c);
    if (values.size() != instr.operands.size() || !instr.result.shape.empty())
      continue;
    if (auto folded = fold(instr, values)) {
      ir::Builder builder(cell, block);
      ir::Attrs attrs;
      attrs.value = *folded;
      ir::Value* constant = builder.insert(i, Op::Const, {}, attrs);
      ++i; // `instr` moved one place down
      ir::replaceAllUses(cell, &instr.result, constant);
      changed = true;
    }
  }
  return changed;
}

} // namespace

bool simplify(ir::Cell& cell) {
  bool changed = simplifyBlock(cell, cell.pre);
  changed |= simplifyBlock(cell, cell.step);
  return changed;
}

} // namespace rnnc::passes

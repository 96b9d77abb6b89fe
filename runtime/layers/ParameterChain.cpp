#include "runtime/layers/ParameterChain.h"

#include "ir/Error.h"
#include "runtime/exec/Interpreter.h"

#include <fmt/format.h>

#include <cmath>

namespace rnnc {
namespace {

using ir::Op;

int64_t columnsOf(const Tensor& t) {
  return t.rank() == 0 ? 1 : t.shape().back();
}

// Element i of a result of `total` elements and `columns` columns, read from an operand that
// the interpreter broadcast to it: a scalar, a row of the columns, or the result's own shape.
float broadcastAt(const Tensor& operand, int64_t i, int64_t total, int64_t columns) {
  const int64_t n = operand.numel();
  if (n == total)
    return operand.data()[i];
  if (n == 1)
    return operand.data()[0];
  RNNC_INTERNAL_CHECK(n == columns, "an operand broadcast other than as a scalar or a row");
  return operand.data()[i % columns];
}

// `full` (a result's shape) summed down to `into`'s shape, undoing broadcastAt, and added.
void addReduced(const Tensor& full, Tensor& into) {
  const int64_t n = into.numel(), total = full.numel(), columns = columnsOf(full);
  float* out = into.data();
  for (int64_t i = 0; i < total; ++i) {
    const int64_t at = n == total ? i : n == 1 ? 0 : i % columns;
    out[at] += full.data()[i];
  }
}

} // namespace

ParameterChain::ParameterChain(const ir::Cell& cell, const std::vector<Tensor>& params)
    : cell_(cell), params_(params) {
  for (const ir::Block* block : {&cell.pre, &cell.step})
    for (const auto& instr : *block) {
      positions_[&instr->result] = instrs_.size();
      instrs_.push_back(instr.get());
    }
  for (size_t i = 0; i < cell.params.size(); ++i)
    paramIndex_[cell.params[i].get()] = i;
}

const Tensor& ParameterChain::valueOf(const ir::Value* v) {
  if (auto param = paramIndex_.find(v); param != paramIndex_.end())
    return params_.at(param->second);
  auto position = positions_.find(v);
  RNNC_INTERNAL_CHECK(position != positions_.end(), "a weight made of more than parameters");
  return value(position->second);
}

const Tensor& ParameterChain::value(size_t position) {
  if (auto done = values_.find(position); done != values_.end())
    return done->second;
  const ir::Instr& instr = *instrs_.at(position);
  std::vector<const Tensor*> operands;
  for (const ir::Value* operand : instr.operands)
    operands.push_back(&valueOf(operand));
  return values_[position] = evaluateUnbatched(instr, operands, cell_.sizes);
}

void ParameterChain::backpropagate(size_t position, const Tensor& gradient,
                                   std::vector<Tensor>& paramGradients) {
  // Gradients of the chain's values by position, visited from the latest down: an operand's
  // instruction comes before its reader, so each is complete when it is visited.
  std::map<size_t, Tensor> gradients;
  gradients[position] = gradient;
  auto addTo = [&](const ir::Value* operand, const Tensor& full) {
    if (auto param = paramIndex_.find(operand); param != paramIndex_.end()) {
      addReduced(full, paramGradients.at(param->second));
      return;
    }
    const size_t at = positions_.at(operand);
    if (instrs_[at]->op == Op::Const)
      return;
    addReduced(full, gradients.try_emplace(at, value(at).shape()).first->second);
  };
  while (!gradients.empty()) { // the latest position first
    const auto last = std::prev(gradients.end());
    const size_t p = last->first;
    const Tensor g = std::move(last->second);
    gradients.erase(last);
    const ir::Instr& instr = *instrs_[p];
    const Tensor& r = value(p);
    const int64_t total = r.numel(), columns = columnsOf(r);
    std::vector<const Tensor*> x;
    for (const ir::Value* operand : instr.operands)
      x.push_back(&valueOf(operand));
    auto at = [&](int k, int64_t i) {
      return broadcastAt(*x[static_cast<size_t>(k)], i, total, columns);
    };
    // Each operand's share, elementwise: share(k, i) is d(result_i)/d(operand k at i) * g_i.
    auto distribute = [&](auto&& share) {
      for (size_t k = 0; k < x.size(); ++k) {
        Tensor full(r.shape());
        for (int64_t i = 0; i < total; ++i)
          full.data()[i] = share(static_cast<int>(k), i);
        addTo(instr.operands[k], full);
      }
    };
    const float* gv = g.data();
    const float* rv = r.data();
    switch (instr.op) {
    case Op::Const:
      break;
    case Op::Slice: {
      const int64_t offset = instr.attrs.offset.constantValue(), from = columnsOf(*x[0]);
      Tensor full(x[0]->shape());
      for (int64_t i = 0; i < total; ++i)
        full.data()[i / columns * from + offset + i % columns] = gv[i];
      addTo(instr.operands[0], full);
      break;
    }
    case Op::Concat: {
      int64_t offset = 0;
      for (size_t k = 0; k < x.size(); ++k) {
        const int64_t width = columnsOf(*x[k]);
        Tensor part(x[k]->shape());
        for (int64_t i = 0; i < part.numel(); ++i)
          part.data()[i] = gv[i / width * columns + offset + i % width];
        addTo(instr.operands[k], part);
        offset += width;
      }
      break;
    }
    case Op::Add:
      distribute([&](int, int64_t i) { return gv[i]; });
      break;
    case Op::Sub:
      distribute([&](int k, int64_t i) { return k == 0 ? gv[i] : -gv[i]; });
      break;
    case Op::Mul:
      distribute([&](int k, int64_t i) { return gv[i] * at(1 - k, i); });
      break;
    case Op::Div: // d(a/b) = da/b - r db/b
      distribute(
          [&](int k, int64_t i) { return k == 0 ? gv[i] / at(1, i) : -gv[i] * rv[i] / at(1, i); });
      break;
    case Op::Min:
    case Op::Max: // as torch.minimum/maximum: the winner takes g, a tie splits it evenly
      distribute([&](int k, int64_t i) {
        const float a = at(0, i), b = at(1, i);
        const float share = a == b ? 0.5f : ((a < b) == (instr.op == Op::Min) ? 1.0f : 0.0f);
        return gv[i] * (k == 0 ? share : 1.0f - share);
      });
      break;
    case Op::Dropout: // in inference, the identity (a training run's is a mask parameter)
      distribute([&](int, int64_t i) { return gv[i]; });
      break;
    case Op::Neg:
      distribute([&](int, int64_t i) { return -gv[i]; });
      break;
    case Op::Sigmoid:
      distribute([&](int, int64_t i) { return gv[i] * rv[i] * (1.0f - rv[i]); });
      break;
    case Op::Tanh:
      distribute([&](int, int64_t i) { return gv[i] * (1.0f - rv[i] * rv[i]); });
      break;
    case Op::Relu: // as torch: g where the result is positive
      distribute([&](int, int64_t i) { return rv[i] > 0 ? gv[i] : 0.0f; });
      break;
    case Op::Exp:
      distribute([&](int, int64_t i) { return gv[i] * rv[i]; });
      break;
    case Op::Log:
      distribute([&](int, int64_t i) { return gv[i] / at(0, i); });
      break;
    case Op::Sqrt:
      distribute([&](int, int64_t i) { return gv[i] * 0.5f / rv[i]; });
      break;
    case Op::Clamp: { // as torch: g where lo <= x <= hi
      const double lo = instr.attrs.lo, hi = instr.attrs.hi;
      distribute([&](int, int64_t i) {
        const float v = at(0, i);
        return v >= lo && v <= hi ? gv[i] : 0.0f;
      });
      break;
    }
    default:
      throw UserError(fmt::format("cell '{}': a weight made of parameters through '{}' does not "
                                  "train (passes::differentiableInWeights)",
                                  cell_.name, ir::opName(instr.op)));
    }
  }
}

} // namespace rnnc

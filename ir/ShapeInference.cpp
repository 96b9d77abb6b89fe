#include "ir/ShapeInference.h"

#include <fmt/format.h>

#include <cmath>

namespace rnnc::ir {
namespace {

[[noreturn]] void fail(const std::string& message) {
  throw ShapeError(message);
}

std::string operandList(const std::vector<const Shape*>& operands) {
  std::string out;
  for (size_t i = 0; i < operands.size(); ++i)
    out += (i ? " and " : "") + shapeStr(*operands[i]);
  return out;
}

void requireRank(Op op, const Shape& shape, size_t minRank, size_t maxRank, const char* what) {
  if (shape.size() < minRank || shape.size() > maxRank)
    fail(fmt::format("{}: {} must have rank {}, got {}", opName(op), what,
                     minRank == maxRank ? std::to_string(minRank)
                                        : fmt::format("{} to {}", minRank, maxRank),
                     shapeStr(shape)));
}

Shape inferMatrixProduct(Op op, const Shape& x, const Shape& w) {
  requireRank(op, x, 2, 2, "the left operand");
  requireRank(op, w, 2, 2, "the weight");
  // linear: x[M, K] @ W[N, K]^T; matmul: x[M, K] @ W[K, N].
  for (const Dim& d : w)
    if (d.mentions(kBatchSymbol))
      fail(fmt::format("{}: the right operand {} must be a weight, without the batch dimension B",
                       opName(op), shapeStr(w)));
  const Dim& k = op == Op::Linear ? w[1] : w[0];
  const Dim& n = op == Op::Linear ? w[0] : w[1];
  if (x[1] != k)
    fail(fmt::format("{}: cannot multiply {} by {}{}: inner sizes {} and {} differ", opName(op),
                     shapeStr(x), shapeStr(w), op == Op::Linear ? "^T" : "", x[1].str(), k.str()));
  return {x[0], n};
}

Shape inferConcat(const std::vector<const Shape*>& operands) {
  const Shape& first = *operands[0];
  if (first.empty())
    fail("concat: cannot concatenate scalars");
  Dim total;
  for (const Shape* s : operands) {
    bool leadingMatch = s->size() == first.size() &&
                        std::equal(s->begin(), s->end() - 1, first.begin(), first.end() - 1);
    if (!leadingMatch)
      fail(fmt::format("concat: operands {} differ in more than the last dimension",
                       operandList(operands)));
    total = total + s->back();
  }
  Shape result = first;
  result.back() = total;
  return result;
}

// Stacks the rows of weights (no batch dimension): [R1, C], [R2, C], ... -> [R1 + R2 + ..., C].
Shape inferStack(const std::vector<const Shape*>& operands) {
  Dim rows;
  for (const Shape* s : operands) {
    if (s->size() != 2 || s->at(1) != operands[0]->at(1))
      fail(fmt::format("stack: operands {} must be matrices with equal column counts",
                       operandList(operands)));
    for (const Dim& d : *s)
      if (d.mentions(kBatchSymbol))
        fail(fmt::format("stack: operand {} has the batch dimension B; stack stacks weights",
                         shapeStr(*s)));
    rows = rows + s->at(0);
  }
  return {rows, operands[0]->at(1)};
}

Shape inferSlice(const Shape& x, const Attrs& attrs, const Dim* size) {
  if (x.empty())
    fail("slice: cannot slice a scalar");
  RNNC_INTERNAL_CHECK(size, "slice shape inference needs the slice size");
  const Dim& extent = x.back();
  bool inBounds = attrs.offset.isProvablyNonNegative() && size->isProvablyPositive() &&
                  (extent - attrs.offset - *size).isProvablyNonNegative();
  if (!inBounds)
    fail(fmt::format("slice: [{} : {}] is not within the last dimension of {}", attrs.offset.str(),
                     (attrs.offset + *size).str(), shapeStr(x)));
  Shape result = x;
  result.back() = *size;
  return result;
}

} // namespace

std::optional<Shape> broadcastShapes(const Shape& a, const Shape& b) {
  const Shape& longer = a.size() >= b.size() ? a : b;
  const Shape& shorter = a.size() >= b.size() ? b : a;
  size_t skip = longer.size() - shorter.size();
  for (size_t i = 0; i < shorter.size(); ++i)
    if (shorter[i] != longer[skip + i])
      return std::nullopt;
  return longer;
}

Shape inferShape(Op op, const std::vector<const Shape*>& operands, const Attrs& attrs,
                 const Dim* sliceSize) {
  int arity = opArity(op);
  if (arity >= 0 ? static_cast<int>(operands.size()) != arity : operands.empty())
    fail(fmt::format("{} takes {} operand(s), got {}", opName(op),
                     arity >= 0 ? std::to_string(arity) : "one or more", operands.size()));
  for (const Shape* s : operands)
    if (s->size() > 2)
      fail(fmt::format("{}: operand of rank {} ({}); values have rank 0, 1 or 2", opName(op),
                       s->size(), shapeStr(*s)));

  switch (op) {
  case Op::Const:
    return {};
  case Op::Slice:
    return inferSlice(*operands[0], attrs, sliceSize);
  case Op::Concat:
    return inferConcat(operands);
  case Op::Stack:
    return inferStack(operands);
  case Op::Linear:
  case Op::MatMul:
    return inferMatrixProduct(op, *operands[0], *operands[1]);
  case Op::LayerNorm:
    requireRank(op, *operands[0], 1, 2, "the operand");
    if (!(attrs.value > 0))
      fail(fmt::format("layernorm: eps must be positive, got {}", attrs.value));
    return *operands[0];
  case Op::LayerNormGrad:
    requireRank(op, *operands[0], 1, 2, "the operand");
    if (*operands[1] != *operands[0])
      fail(fmt::format("layernorm_grad: the gradient {} must have the operand's shape {}",
                       shapeStr(*operands[1]), shapeStr(*operands[0])));
    if (!(attrs.value > 0))
      fail(fmt::format("layernorm_grad: eps must be positive, got {}", attrs.value));
    return *operands[0];
  case Op::Clamp:
    if (!(attrs.lo <= attrs.hi))
      fail(fmt::format("clamp: lo ({}) must not exceed hi ({})", attrs.lo, attrs.hi));
    return *operands[0];
  case Op::Dropout:
    if (!(attrs.value >= 0 && attrs.value < 1))
      fail(fmt::format("dropout: p must be in [0, 1), got {}", attrs.value));
    return *operands[0];
  case Op::DropoutMask:
    if (!(attrs.value >= 0 && attrs.value < 1))
      fail(fmt::format("dropout_mask: p must be in [0, 1), got {}", attrs.value));
    if (!(attrs.stream >= 0 && attrs.stream < 0x1p53 && attrs.stream == std::floor(attrs.stream)))
      fail(fmt::format("dropout_mask: stream must be a whole number, got {}", attrs.stream));
    if (!hasBatch(*operands[0]))
      fail(fmt::format("dropout_mask: the operand {} has no batch dimension (a mask is drawn "
                       "per row)",
                       shapeStr(*operands[0])));
    return *operands[0];
  default:
    break;
  }

  RNNC_INTERNAL_CHECK(isElementwise(op), "no shape rule for op " + std::string(opName(op)));
  if (operands.size() == 1)
    return *operands[0];
  auto shape = broadcastShapes(*operands[0], *operands[1]);
  if (!shape) {
    static const char* verbs[] = {"add", "subtract", "multiply", "divide"};
    std::string verb = op == Op::Add   ? verbs[0]
                       : op == Op::Sub ? verbs[1]
                       : op == Op::Mul ? verbs[2]
                       : op == Op::Div ? verbs[3]
                                       : std::string("take the ") + std::string(opName(op)) + " of";
    fail(fmt::format("cannot {} {} and {}", verb, shapeStr(*operands[0]), shapeStr(*operands[1])));
  }
  return *shape;
}

} // namespace rnnc::ir

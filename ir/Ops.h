// The IR's op enum and per-op facts, all expanded from ir/Ops.def.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace rnnc::ir {

enum OpTrait : unsigned {
  kNone = 0,
  kElementwise = 1u << 0,
  kCommutative = 1u << 1,
  kView = 1u << 2,
  kRowwise = 1u << 3,
};

// The attributes an op carries (stored in ir::Attrs).
enum class AttrKind {
  None,
  Value,  // const: {value = 1.5}
  Offset, // slice: {offset = 2*hidden_size}
  Range,  // clamp: {lo = -1, hi = 1}
  Prob,   // dropout: {p = 0.5}
  Mask,   // dropout_mask: {p = 0.5, stream = 0}
  Eps,    // layernorm: {eps = 1e-05}
};

enum class Op {
#define RNNC_OP(Enum, mnemonic, arity, traits, attrs) Enum,
#include "ir/Ops.def"
};

std::string_view opName(Op op);
std::optional<Op> opFromName(std::string_view mnemonic);
int opArity(Op op); // -1: variadic
unsigned opTraits(Op op);
AttrKind opAttrKind(Op op);

inline bool isElementwise(Op op) {
  return opTraits(op) & kElementwise;
}
inline bool isCommutative(Op op) {
  return opTraits(op) & kCommutative;
}
inline bool isView(Op op) {
  return opTraits(op) & kView;
}
inline bool isMatrixProduct(Op op) {
  return op == Op::Linear || op == Op::MatMul;
}

} // namespace rnnc::ir

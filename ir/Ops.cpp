#include "ir/Ops.h"

namespace rnnc::ir {
namespace {

struct OpInfo {
  std::string_view name;
  int arity;
  unsigned traits;
  AttrKind attrs;
};

constexpr OpInfo kOpInfo[] = {
#define RNNC_OP(Enum, mnemonic, arity, traits, attrs) {mnemonic, arity, traits, attrs},
#include "ir/Ops.def"
};

const OpInfo& info(Op op) {
  return kOpInfo[static_cast<int>(op)];
}

} // namespace

std::string_view opName(Op op) {
  return info(op).name;
}
int opArity(Op op) {
  return info(op).arity;
}
unsigned opTraits(Op op) {
  return info(op).traits;
}
AttrKind opAttrKind(Op op) {
  return info(op).attrs;
}

std::optional<Op> opFromName(std::string_view mnemonic) {
  for (size_t i = 0; i < std::size(kOpInfo); ++i)
    if (kOpInfo[i].name == mnemonic)
      return static_cast<Op>(i);
  return std::nullopt;
}

} // namespace rnnc::ir

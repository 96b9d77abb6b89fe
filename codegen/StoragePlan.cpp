#include "codegen/StoragePlan.h"

#include "ir/Error.h"

namespace rnnc::codegen {
namespace {

bool isBatched(const ir::Value* value) {
  return !value->shape.empty() && value->shape[0].mentions(ir::kBatchSymbol);
}

// Whether an instruction's result is read by anything outside its own kernel.
bool usedOutsideKernel(const ir::Cell& cell, const ir::Instr& instr) {
  if (cell.output == &instr.result)
    return true;
  for (const ir::StateUpdate& update : cell.updates)
    if (update.next == &instr.result)
      return true;
  for (const ir::Block* block : {&cell.pre, &cell.step})
    for (const auto& user : *block)
      for (const ir::Value* operand : user->operands)
        if (operand == &instr.result && (instr.kernel < 0 || user->kernel != instr.kernel))
          return true;
  return false;
}

} // namespace

bool isViewOrImmediate(const ir::Value* value) {
  return !value->isArgument() &&
         (value->def->op == ir::Op::Slice || value->def->op == ir::Op::Const);
}

int64_t columnsOf(const ir::Value* value) {
  if (value->shape.empty())
    return 1;
  const ir::Dim& last = value->shape.back();
  RNNC_INTERNAL_CHECK(last.isConstant(), "unbound size in " + ir::shapeStr(value->shape));
  return last.constantValue();
}

int64_t fixedRowsOf(const ir::Value* value) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < value->shape.size(); ++i) {
    RNNC_INTERNAL_CHECK(value->shape[i].isConstant(),
                        "unbound size in " + ir::shapeStr(value->shape));
    rows *= value->shape[i].constantValue();
  }
  return rows;
}

// The argument a value reads, looking through slices; null if it is not a view of an argument.
const ir::Value* viewedArgument(const ir::Value* value) {
  while (!value->isArgument() && value->def->op == ir::Op::Slice)
    value = value->def->operands[0];
  return value->isArgument() ? value : nullptr;
}

std::vector<KernelGroup> kernelGroups(const ir::Block& block) {
  std::vector<KernelGroup> groups;
  for (size_t i = 0; i < block.size();) {
    const ir::Instr& instr = *block[i];
    size_t end = i + 1;
    if (instr.kernel >= 0)
      while (end < block.size() && block[end]->kernel == instr.kernel)
        ++end;
    bool emitsLoop =
        instr.kernel >= 0 || (ir::isElementwise(instr.op) && instr.op != ir::Op::Const);
    if (emitsLoop)
      groups.push_back({i, end});
    i = end;
  }
  return groups;
}

StoragePlan planStorage(const ir::Cell& cell) {
  StoragePlan plan;
  for (const ir::Block* block : {&cell.pre, &cell.step}) {
    bool inPre = block == &cell.pre;
    for (const auto& instr : *block) {
      const ir::Value* value = &instr->result;
      if (isViewOrImmediate(value))
        continue;
      bool kernelInternal = ir::isFusible(instr->op) && !usedOutsideKernel(cell, *instr);
      if (kernelInternal)
        continue;
      if (!inPre && value == cell.output) {
        plan.outputInPlace = true;
        continue;
      }
      Rows rows = !isBatched(value) ? Rows::Fixed : inPre ? Rows::Sequence : Rows::Step;
      plan.bufferOf[value] = plan.buffers.size();
      plan.buffers.push_back(
          {value, rows, rows == Rows::Fixed ? fixedRowsOf(value) : 0, columnsOf(value)});
    }
  }
  for (const ir::StateUpdate& update : cell.updates) {
    const ir::Value* source = viewedArgument(update.next);
    bool readsState = source && source->argKind == ir::ArgKind::State && source != update.state;
    plan.staging.push_back(readsState ? static_cast<int>(plan.buffers.size()) : -1);
    if (readsState)
      plan.buffers.push_back({update.next, Rows::Step, 1, columnsOf(update.next)});
  }
  return plan;
}

} // namespace rnnc::codegen

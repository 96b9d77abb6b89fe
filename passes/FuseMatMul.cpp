#include "passes/FuseMatMul.h"

#include <algorithm>

namespace rnnc::passes {
namespace {

// The kernel every use of `product` belongs to, if every use is a slice in one kernel whose
// width is `columns`; -1 otherwise.
int consumingKernel(const ir::Cell& cell, const ir::Instr& product, const ir::Dim& columns) {
  if (cell.output == &product.result)
    return -1;
  for (const ir::StateUpdate& update : cell.updates)
    if (update.next == &product.result)
      return -1;
  int kernel = -1;
  for (const ir::Block* block : {&cell.pre, &cell.step})
    for (const auto& user : *block)
      for (const ir::Value* operand : user->operands) {
        if (operand != &product.result)
          continue;
        if (user->op != ir::Op::Slice || user->kernel < 0 || user->result.shape.back() != columns ||
            (kernel >= 0 && user->kernel != kernel))
          return -1;
        kernel = user->kernel;
      }
  return kernel;
}

// The width of a kernel's iteration space, if it is [B, C] and the kernel has no layer norm;
// null otherwise.
const ir::Dim* kernelColumns(const ir::Block& block, int kernel) {
  const ir::Dim* columns = nullptr;
  for (const auto& instr : block) {
    if (instr->kernel != kernel)
      continue;
    if (instr->op == ir::Op::LayerNorm)
      return nullptr;
    const ir::Shape& shape = instr->result.shape;
    if (shape.size() == 2 && instr->result.isBatched() && !columns)
      columns = &shape[1];
  }
  return columns;
}

} // namespace

bool fuseMatMul(ir::Cell& cell) {
  bool changed = false;
  ir::Block& block = cell.step;
  // Each product moves down at most once (it then belongs to a kernel), so re-reading the
  // instruction that slides into its place terminates.
  for (size_t i = 0; i < block.size();) {
    ir::Instr& product = *block[i];
    if (!ir::isMatrixProduct(product.op) || product.kernel >= 0) {
      ++i;
      continue;
    }
    const ir::Value* x = product.operands[0];
    const ir::Value* w = product.operands[1];
    if (product.operands.size() != 2 || !x->isBatched() || x->shape.size() != 2 ||
        w->shape.size() != 2 || w->isBatched()) {
      ++i;
      continue;
    }
    // The kernel's width, read off its first slice of the product.
    int kernel = -1;
    const ir::Dim* columns = nullptr;
    for (const auto& user : block)
      if (user->op == ir::Op::Slice && user->operands[0] == &product.result && user->kernel >= 0) {
        kernel = user->kernel;
        columns = kernelColumns(block, kernel);
        break;
      }
    if (!columns || consumingKernel(cell, product, *columns) != kernel) {
      ++i;
      continue;
    }
    // Move the product down to the kernel's first member; everything it reads is defined
    // above its old place, and nothing in between reads it.
    size_t start = i + 1;
    while (block[start]->kernel != kernel)
      ++start;
    std::unique_ptr<ir::Instr> moved = std::move(block[i]);
    moved->kernel = kernel;
    block.erase(block.begin() + static_cast<std::ptrdiff_t>(i));
    block.insert(block.begin() + static_cast<std::ptrdiff_t>(start - 1), std::move(moved));
    changed = true;
  }
  return changed;
}

} // namespace rnnc::passes

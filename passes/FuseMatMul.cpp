#include "passes/FuseMatMul.h"

#include "ir/Builder.h"

#include <algorithm>

namespace rnnc::passes {
namespace {

// Whether the step hands `value` on whole: as its output or as a state's next value.
bool leavesTheStep(const ir::Cell& cell, const ir::Value* value) {
  return cell.output == value ||
         std::any_of(cell.updates.begin(), cell.updates.end(),
                     [&](const ir::StateUpdate& update) { return update.next == value; });
}

// Whether every use of `value` is an instruction of kernel `kernel` (not the output or a next
// state).
bool usedOnlyIn(const ir::Cell& cell, const ir::Value* value, int kernel) {
  if (leavesTheStep(cell, value))
    return false;
  for (const ir::Block* block : {&cell.pre, &cell.step})
    for (const auto& user : *block)
      for (const ir::Value* operand : user->operands)
        if (operand == value && user->kernel != kernel)
          return false;
  return true;
}

// The kernel every use of `product` belongs to, if every use is a slice in one kernel whose
// width is `columns`, read only inside that kernel (a fused product has no storage, so neither
// has a view of it); -1 otherwise.
int consumingKernel(const ir::Cell& cell, const ir::Instr& product, const ir::Dim& columns) {
  if (leavesTheStep(cell, &product.result))
    return -1;
  int kernel = -1;
  for (const ir::Block* block : {&cell.pre, &cell.step})
    for (const auto& user : *block)
      for (const ir::Value* operand : user->operands) {
        if (operand != &product.result)
          continue;
        if (user->op != ir::Op::Slice || user->kernel < 0 || user->result.shape.back() != columns ||
            (kernel >= 0 && user->kernel != kernel) ||
            !usedOnlyIn(cell, &user->result, user->kernel))
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

// Whether a kernel already leads with a matrix product: it can hold only one.
bool holdsProduct(const ir::Block& block, int kernel) {
  return std::any_of(block.begin(), block.end(), [&](const auto& instr) {
    return instr->kernel == kernel && ir::isMatrixProduct(instr->op);
  });
}

// A product that one kernel reads whole (a vanilla RNN's tanh(h @ W_hh^T + pre)) is read
// through one slice of all its columns instead, inserted into that kernel before its first
// reader: the shape the rest of this pass and the emitter handle, as for gate slices.
void sliceWholeUses(ir::Cell& cell, ir::Block& block, size_t productIndex) {
  ir::Value* product = &block[productIndex]->result;
  int kernel = -1;
  size_t firstReader = 0;
  for (size_t i = productIndex + 1; i < block.size(); ++i) {
    const ir::Instr& user = *block[i];
    bool reads =
        std::find(user.operands.begin(), user.operands.end(), product) != user.operands.end();
    if (!reads || user.op == ir::Op::Slice)
      continue;
    if (user.kernel < 0 || (kernel >= 0 && user.kernel != kernel))
      return; // read outside a kernel, or by two: the product stays a GEMM
    if (kernel < 0)
      firstReader = i;
    kernel = user.kernel;
  }
  // Only where the product will then fuse: a [B, C] kernel without a layer norm or a product
  // of its own, as wide as the product, which is neither the output nor a next state.
  if (kernel < 0 || holdsProduct(block, kernel))
    return;
  const ir::Dim* columns = kernelColumns(block, kernel);
  if (!columns || *columns != product->shape.back() || leavesTheStep(cell, product))
    return;
  ir::Builder builder(cell, block);
  ir::Value* whole = builder.slice(product, ir::Dim::constant(0), product->shape.back());
  std::unique_ptr<ir::Instr> made = std::move(block.back());
  block.pop_back();
  made->kernel = kernel;
  block.insert(block.begin() + static_cast<std::ptrdiff_t>(firstReader), std::move(made));
  for (size_t i = firstReader + 1; i < block.size(); ++i)
    if (block[i]->kernel == kernel)
      for (ir::Value*& operand : block[i]->operands)
        if (operand == product)
          operand = whole;
}

} // namespace

bool fuseMatMul(ir::Cell& cell) {
  bool changed = false;
  // The recurrent product in the step; the input projection in the pre block, whose kernel
  // (the biases) then runs on each tile while it is in registers.
  for (ir::Block* blockPtr : {&cell.pre, &cell.step}) {
    ir::Block& block = *blockPtr;
    // Each product moves down at most once (it then belongs to a kernel), so re-reading the
    // instruction that slides into its place terminates.
    for (size_t i = 0; i < block.size();) {
      ir::Instr& product = *block[i];
      if (product.kernel >= 0 || !ir::hasPackableWeights(cell, product)) {
        ++i;
        continue;
      }
      sliceWholeUses(cell, block, i);
      // The kernel's width, read off its first slice of the product.
      int kernel = -1;
      const ir::Dim* columns = nullptr;
      for (const auto& user : block)
        if (user->op == ir::Op::Slice && user->operands[0] == &product.result &&
            user->kernel >= 0) {
          kernel = user->kernel;
          columns = kernelColumns(block, kernel);
          break;
        }
      if (!columns || consumingKernel(cell, product, *columns) != kernel ||
          holdsProduct(block, kernel)) {
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
  }
  return changed;
}

} // namespace rnnc::passes

#include "passes/Fuse.h"

#include "ir/ShapeInference.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

namespace rnnc::passes {
namespace {

// Ops that stay outside kernels: matrix products, layer norm, concat (a copy into a wider
// buffer), and anything not elementwise.
bool joinsKernels(ir::Op op) {
  return ir::isElementwise(op) || op == ir::Op::Slice;
}

// Moves every non-fusible instruction up to just after the last definition it reads, keeping
// the relative order of everything else, so fusible work gathers into long runs.
bool scheduleBarriersEarly(ir::Block& block) {
  bool changed = false;
  for (size_t i = 0; i < block.size(); ++i) {
    if (joinsKernels(block[i]->op))
      continue;
    size_t target = 0;
    for (size_t j = 0; j < i; ++j)
      for (const ir::Value* operand : block[i]->operands)
        if (&block[j]->result == operand)
          target = std::max(target, j + 1);
    // Do not jump over earlier barriers: their order is the program's.
    for (size_t j = target; j < i; ++j)
      if (!joinsKernels(block[j]->op))
        target = j + 1;
    if (target < i) {
      std::unique_ptr<ir::Instr> moved = std::move(block[i]);
      block.erase(block.begin() + static_cast<std::ptrdiff_t>(i));
      block.insert(block.begin() + static_cast<std::ptrdiff_t>(target), std::move(moved));
      changed = true;
    }
  }
  return changed;
}

// Assigns kernel numbers to maximal runs of fusible instructions whose shapes broadcast to one
// iteration space: [F] members (bias slices) are computed per element of a [B, F] kernel.
// Constants join a kernel but do not start one; they are immediates wherever they are used.
bool formKernels(ir::Block& block, int& nextKernel) {
  bool changed = false;
  int current = -1;
  ir::Shape space;
  std::unordered_map<const ir::Value*, int> kernelOf;
  for (auto& instr : block) {
    int before = instr->kernel;
    const ir::Shape& shape = instr->result.shape;
    std::optional<ir::Shape> widened =
        current >= 0 ? ir::broadcastShapes(space, shape) : std::optional<ir::Shape>(shape);
    bool fits = joinsKernels(instr->op) && widened.has_value();
    // A slice of a value made in the same kernel would need a second iteration space.
    if (fits && instr->op == ir::Op::Slice && current >= 0) {
      auto it = kernelOf.find(instr->operands[0]);
      fits = it == kernelOf.end() || it->second != current;
    }
    if (!fits)
      current = -1;
    if (fits && current < 0 && instr->op != ir::Op::Const) {
      current = nextKernel++;
      widened = shape;
    }
    instr->kernel = fits ? current : -1;
    if (instr->kernel >= 0) {
      space = *widened;
      kernelOf[&instr->result] = current;
    }
    changed |= instr->kernel != before;
  }
  return changed;
}

} // namespace

bool fuseElementwise(ir::Cell& cell) {
  bool changed = false;
  int nextKernel = 0;
  for (ir::Block* block : {&cell.pre, &cell.step}) {
    changed |= scheduleBarriersEarly(*block);
    changed |= formKernels(*block, nextKernel);
  }
  return changed;
}

} // namespace rnnc::passes

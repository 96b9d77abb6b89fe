#include "passes/Fuse.h"

#include "ir/ShapeInference.h"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

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
// A layer norm joins when its operand comes from outside the kernel and its rows match: the
// kernel normalises each row on the fly, so its consumers may even be slices of it (the gates
// of lnlstm), and it does not set the iteration space.
bool formKernels(ir::Block& block, int& nextKernel,
                 const std::unordered_set<const ir::Instr*>& excluded) {
  bool changed = false;
  int current = -1;
  std::optional<ir::Shape> space; // unset until a member that is not a layer norm joins
  ir::ValueMap<int> kernelOf;
  auto inCurrent = [&](const ir::Value* v) {
    const int* kernel = kernelOf.find(v);
    return current >= 0 && kernel && *kernel == current;
  };
  auto rowsOf = [](const ir::Shape& s) {
    return ir::Shape(s.begin(), s.end() - (s.empty() ? 0 : 1));
  };
  for (auto& instr : block) {
    int before = instr->kernel;
    const ir::Shape& shape = instr->result.shape;
    bool fits = false;
    std::optional<ir::Shape> widened = space;
    if (excluded.count(instr.get())) {
      fits = false;
    } else if (instr->op == ir::Op::LayerNorm) {
      fits = !inCurrent(instr->operands[0]) &&
             (current < 0 || !space || rowsOf(*space) == rowsOf(shape));
    } else if (joinsKernels(instr->op)) {
      widened = space ? ir::broadcastShapes(*space, shape) : std::optional<ir::Shape>(shape);
      fits = widened.has_value();
      // A slice of a value made in the same kernel would need a second iteration space, unless
      // it is a layer norm, which can be computed at any column.
      if (fits && instr->op == ir::Op::Slice && inCurrent(instr->operands[0]))
        fits = instr->operands[0]->def->op == ir::Op::LayerNorm;
    }
    if (!fits)
      current = -1;
    if (fits && current < 0) {
      if (instr->op == ir::Op::Const) {
        fits = false;
      } else {
        current = nextKernel++;
        space.reset();
        widened = instr->op == ir::Op::LayerNorm ? std::nullopt : std::optional<ir::Shape>(shape);
      }
    }
    instr->kernel = fits ? current : -1;
    if (instr->kernel >= 0) {
      space = widened;
      kernelOf[&instr->result] = current;
    }
    changed |= instr->kernel != before;
  }
  return changed;
}

} // namespace

// A fused layer norm has no storage: its values are computed where the kernel reads them. So
// the norm, and any slice of it, must be read only inside its own kernel.
const ir::Instr* escapingNorm(const ir::Cell& cell, const ir::Block& block) {
  for (const auto& instr : block) {
    if (instr->op != ir::Op::LayerNorm || instr->kernel < 0)
      continue;
    std::vector<const ir::Value*> values = {&instr->result};
    for (const auto& user : block)
      if (user->op == ir::Op::Slice && user->operands[0] == &instr->result)
        values.push_back(&user->result);
    for (const ir::Value* v : values) {
      int inside = 0;
      for (const auto& user : block)
        for (const ir::Value* operand : user->operands)
          inside += operand == v && user->kernel == instr->kernel;
      if (ir::countUses(cell, v) != inside)
        return instr.get();
    }
  }
  return nullptr;
}

namespace {

// A value without a batch dimension computed inside a kernel over [B, ...] would be recomputed
// for every row, and if something outside the kernel reads it, stored from every row: into
// storage that the parameter-only phase of the generated code fills once and runs share. Such a
// value is computed on its own instead, before the kernel.
const ir::Instr* escapingUnbatched(const ir::Cell& cell, const ir::Block& block) {
  for (const auto& instr : block) {
    if (instr->kernel < 0 || instr->op == ir::Op::Const || instr->op == ir::Op::Slice ||
        instr->result.isBatched())
      continue;
    bool batchedKernel = false;
    int inside = 0;
    for (const auto& member : block) {
      if (member->kernel != instr->kernel)
        continue;
      batchedKernel |= member->result.isBatched();
      for (const ir::Value* operand : member->operands)
        inside += operand == &instr->result;
    }
    if (batchedKernel && ir::countUses(cell, &instr->result) != inside)
      return instr.get();
  }
  return nullptr;
}

// Moves `instr` up to just after the last definition it reads.
void hoist(ir::Block& block, const ir::Instr* instr) {
  size_t at = 0, target = 0;
  while (block[at].get() != instr)
    ++at;
  for (size_t j = 0; j < at; ++j)
    for (const ir::Value* operand : instr->operands)
      if (&block[j]->result == operand)
        target = std::max(target, j + 1);
  std::unique_ptr<ir::Instr> moved = std::move(block[at]);
  block.erase(block.begin() + static_cast<std::ptrdiff_t>(at));
  block.insert(block.begin() + static_cast<std::ptrdiff_t>(target), std::move(moved));
}

} // namespace

bool fuseElementwise(ir::Cell& cell) {
  bool changed = false;
  int nextKernel = 0;
  for (ir::Block* block : {&cell.pre, &cell.step}) {
    changed |= scheduleBarriersEarly(*block);
    std::unordered_set<const ir::Instr*> excluded;
    int firstKernel = nextKernel;
    for (;;) {
      nextKernel = firstKernel;
      bool formed = formKernels(*block, nextKernel, excluded);
      if (const ir::Instr* escaping = escapingNorm(cell, *block)) {
        excluded.insert(escaping); // a plain row-wise call instead
        changed = true;
        continue;
      }
      if (const ir::Instr* unbatched = escapingUnbatched(cell, *block)) {
        excluded.insert(unbatched);
        hoist(*block, unbatched); // out of the way of the kernel it left
        changed = true;
        continue;
      }
      changed |= formed;
      break;
    }
  }
  return changed;
}

} // namespace rnnc::passes

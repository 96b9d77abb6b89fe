#include "passes/TrainingDropout.h"

#include "ir/Builder.h"
#include "ir/Verifier.h"

#include <cstddef>
#include <string>

namespace rnnc::passes {

bool lowerTrainingDropout(ir::Cell& cell) {
  bool changed = false;
  int stream = 0;
  for (ir::Block* block : {&cell.pre, &cell.step}) {
    ir::Builder builder(cell, *block);
    for (size_t i = 0; i < block->size(); ++i) {
      ir::Instr& instr = *(*block)[i];
      if (instr.op != ir::Op::Dropout)
        continue;
      ir::Value* x = instr.operands[0];
      // Numbered as the interpreter numbers dropouts (one mask for one dropout, p = 0 too):
      // a dropout left here keeps the number it had.
      const int mine = stream++;
      if (!x->isBatched())
        continue; // no rows to draw a mask for: the interpreter's own (see the header)
      ir::Attrs attrs;
      attrs.value = instr.attrs.value;
      attrs.stream = mine;
      ir::Value* mask = builder.insert(i + 1, ir::Op::DropoutMask, {x}, attrs);
      ir::Value* dropped = builder.insert(i + 2, ir::Op::Mul, {x, mask});
      ir::replaceAllUses(cell, &instr.result, dropped);
      // The dropout goes, nothing else: a mask of a dead dropout stays (dead code elimination
      // removes it from what the JIT runs), so that the masks keep the dropouts' order.
      block->erase(block->begin() + static_cast<std::ptrdiff_t>(i));
      changed = true;
      i += 1;
    }
  }
  if (changed)
    ir::verify(cell);
  return changed;
}

std::vector<ParameterDropout> lowerParameterDropout(ir::Cell& cell) {
  std::vector<ParameterDropout> lowered;
  int stream = 0; // dropouts and the masks lowerTrainingDropout left in their place, in order
  for (ir::Block* block : {&cell.pre, &cell.step}) {
    ir::Builder builder(cell, *block);
    for (size_t i = 0; i < block->size(); ++i) {
      ir::Instr& instr = *(*block)[i];
      if (instr.op == ir::Op::DropoutMask)
        ++stream;
      if (instr.op != ir::Op::Dropout)
        continue;
      const int mine = stream++;
      ir::Value* x = instr.operands[0];
      std::string name = "dropout_mask." + std::to_string(mine);
      while (cell.findArgument(name)) // a parameter of the cell's own by that name
        name += "_";
      ir::Value* mask = cell.addArgument(ir::ArgKind::Param, name, x->shape);
      ir::Value* dropped = builder.insert(i + 1, ir::Op::Mul, {x, mask});
      ir::replaceAllUses(cell, &instr.result, dropped);
      lowered.push_back({mask, mine, instr.attrs.value});
      block->erase(block->begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  if (!lowered.empty())
    ir::verify(cell);
  return lowered;
}

} // namespace rnnc::passes

#include "ir/Verifier.h"

#include "ir/Printer.h"
#include "ir/ShapeInference.h"

#include <fmt/format.h>

#include <unordered_set>

namespace rnnc::ir {
namespace {

class Verifier {
public:
  explicit Verifier(const Cell& cell) : cell_(cell) {}

  void run() {
    checkArguments();
    checkBlock(cell_.pre, /*inPre=*/true);
    checkBlock(cell_.step, /*inPre=*/false);
    checkUpdates();
    checkOutput();
  }

private:
  [[noreturn]] void fail(const std::string& reason) const {
    throw UserError("invalid IR in cell '" + cell_.name + "': " + reason + "\n" + toString(cell_));
  }

  bool isPerStep(const Shape& shape) const {
    return shape.size() == 2 && shape[0] == Dim::symbol(kBatchSymbol);
  }

  void checkArguments() {
    std::unordered_set<std::string> names;
    for (ArgKind kind : {ArgKind::Input, ArgKind::State, ArgKind::Param})
      for (const auto& arg : cell_.arguments(kind)) {
        if (arg->name.empty())
          fail(fmt::format("an {} has no name", argKindName(kind)));
        if (!names.insert(arg->name).second)
          fail("argument name '%" + arg->name + "' is used twice");
        if (arg->argKind != kind || !arg->isArgument())
          fail("argument '%" + arg->name + "' is filed under the wrong kind");
        if (kind != ArgKind::Param && !isPerStep(arg->shape))
          fail(fmt::format("{} '%{}' has shape {}, expected [B, F]", argKindName(kind), arg->name,
                           shapeStr(arg->shape)));
        if (kind == ArgKind::Param && (arg->shape.empty() || arg->shape.size() > 2))
          fail("param '%" + arg->name + "' has shape " + shapeStr(arg->shape) +
               ", expected rank 1 or 2");
        for (const Dim& d : arg->shape)
          if (kind == ArgKind::Param && d.mentions(kBatchSymbol))
            fail("param '%" + arg->name + "' depends on the batch size B");
        defined_.insert(arg.get());
      }
  }

  void checkKernels(const Block& block) {
    int previous = -1;
    for (const auto& instr : block) {
      int kernel = instr->kernel;
      if (kernel < 0) {
        previous = -1;
        continue;
      }
      bool product = isMatrixProduct(instr->op);
      if (product && kernel == previous)
        fail(fmt::format("{} in fused kernel {} is not the kernel's first member",
                         opName(instr->op), kernel));
      if (!isFusible(instr->op) && !product)
        fail(fmt::format("{} is in a fused kernel but cannot be fused", opName(instr->op)));
      if (product)
        checkFusedProduct(block, *instr);
      if (kernel != previous && !kernelsSeen_.insert(kernel).second)
        fail(fmt::format("the instructions of fused kernel {} are not contiguous", kernel));
      if (instr->op == Op::LayerNorm && !instr->operands[0]->isArgument() &&
          instr->operands[0]->def->kernel == kernel)
        fail("a fused layernorm must read its operand from outside its kernel");
      previous = kernel;
    }
  }

  // A matrix product leading a kernel (passes/FuseMatMul.h) is read only by slices inside it,
  // and those slices only inside it too: the product lives in registers, one tile at a time,
  // so neither it nor a view of it has storage that code outside the kernel could read.
  void checkFusedProduct(const Block& block, const Instr& product) {
    for (const auto& user : block)
      for (const Value* operand : user->operands)
        if (operand == &product.result && (user->kernel != product.kernel || user->op != Op::Slice))
          fail(fmt::format("the {} fused into kernel {} is read by a {} {}", opName(product.op),
                           product.kernel, opName(user->op),
                           user->kernel == product.kernel ? "in the kernel (only slices may read "
                                                            "it)"
                                                          : "outside the kernel"));
    for (const auto& slice : block) {
      if (slice->op != Op::Slice || slice->operands[0] != &product.result)
        continue;
      for (const Block* other : {&cell_.pre, &cell_.step})
        for (const auto& user : *other)
          for (const Value* operand : user->operands)
            if (operand == &slice->result && user->kernel != product.kernel)
              fail(fmt::format("a slice of the {} fused into kernel {} is read by a {} outside "
                               "the kernel",
                               opName(product.op), product.kernel, opName(user->op)));
      bool leaves = cell_.output == &slice->result;
      for (const StateUpdate& update : cell_.updates)
        leaves |= update.next == &slice->result;
      if (leaves)
        fail(fmt::format("a slice of the {} fused into kernel {} leaves the step",
                         opName(product.op), product.kernel));
    }
    if (cell_.output == &product.result)
      fail(fmt::format("the {} fused into kernel {} is the cell's output", opName(product.op),
                       product.kernel));
  }

  void checkBlock(const Block& block, bool inPre) {
    checkKernels(block);
    for (const auto& instr : block) {
      if (instr->result.def != instr.get())
        fail(fmt::format("a {} result does not point back to its instruction", opName(instr->op)));
      std::vector<const Shape*> shapes;
      for (const Value* operand : instr->operands) {
        if (!operand || !defined_.contains(operand))
          fail(fmt::format("{} uses a value that is not defined before it", opName(instr->op)));
        if (inPre && operand->isArgument() && operand->argKind == ArgKind::State)
          fail(fmt::format("{} in the pre block uses state '%{}'", opName(instr->op),
                           operand->name));
        if (inPre && !operand->isArgument() && !preResults_.contains(operand))
          fail(fmt::format("{} in the pre block uses a step value", opName(instr->op)));
        shapes.push_back(&operand->shape);
      }
      Shape expected;
      try {
        const Dim* size = instr->op == Op::Slice && !instr->result.shape.empty()
                              ? &instr->result.shape.back()
                              : nullptr;
        if (instr->op == Op::Slice && !size)
          fail("slice with a scalar result");
        expected = inferShape(instr->op, shapes, instr->attrs, size);
      } catch (const ShapeError& e) {
        fail(e.what());
      }
      if (expected != instr->result.shape)
        fail(fmt::format("{} has shape {} but its operands give {}", opName(instr->op),
                         shapeStr(instr->result.shape), shapeStr(expected)));
      defined_.insert(&instr->result);
      if (inPre)
        preResults_.insert(&instr->result);
    }
  }

  void checkUpdates() {
    if (cell_.updates.size() != cell_.states.size())
      fail(fmt::format("{} state(s) but {} update(s)", cell_.states.size(), cell_.updates.size()));
    for (size_t i = 0; i < cell_.states.size(); ++i) {
      const StateUpdate& update = cell_.updates[i];
      const Value* state = cell_.states[i].get();
      if (update.state != state)
        fail("updates are not in state order at state '%" + state->name + "'");
      if (!update.next || !defined_.contains(update.next))
        fail("state '%" + state->name + "' is updated with an undefined value");
      if (update.next->shape != state->shape)
        fail(fmt::format("state '%{}' has shape {} but its update has shape {}", state->name,
                         shapeStr(state->shape), shapeStr(update.next->shape)));
    }
  }

  void checkOutput() {
    if (!cell_.output || !defined_.contains(cell_.output))
      fail("the output is not a defined value");
    if (!isPerStep(cell_.output->shape))
      fail("the output has shape " + shapeStr(cell_.output->shape) + ", expected [B, F]");
  }

  const Cell& cell_;
  ValueSet defined_, preResults_;
  std::unordered_set<int> kernelsSeen_;
};

} // namespace

void verify(const Cell& cell) {
  Verifier(cell).run();
}

} // namespace rnnc::ir

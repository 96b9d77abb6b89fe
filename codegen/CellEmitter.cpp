#include "codegen/CellEmitter.h"

#include "codegen/EmitContext.h"
#include "codegen/KernelEmitter.h"
#include "codegen/ProductKernelEmitter.h"
#include "ir/Error.h"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <optional>

namespace rnnc::codegen {

using ir::Op;

namespace {

// The cell's part of the code generator: the arguments, the phases, the time loop and its
// steps, and the blocks' instructions; kernels and matrix products are left to their parts.
class CellEmitter : public EmitContext {
public:
  CellEmitter(llvm::LLVMContext& llvmContext, const ir::Cell& cell, const StoragePlan& plan,
              const Target& target, const std::string& name, CellPart part)
      : EmitContext(llvmContext, cell, plan, target,
                    part == CellPart::Setup ? setupFunctionName(name) : name),
        kernels_(*this), products_(*this, kernels_), part_(part) {
    tileWalks = part == CellPart::Setup ? TileWalks::Defined : TileWalks::Declared;
  }

  std::unique_ptr<llvm::Module> emit();

private:
  void emitSetup();
  void emitDropped(const char* suffix, const std::function<void()>& emit);
  void defineLoopWalks();
  void declareSetupWalks();
  void emitLoop();
  void emitStep(llvm::Value* t);

  // Which of a block's work to emit: the pre block's is split between the parameter phase
  // (no batch dimension) and the pre phase (per row).
  enum class Work { All, PerRow, WithoutBatch };

  // Work split by rows may follow work split by the same rows without a barrier; products
  // and work done on thread 0 alone are fenced on both sides: the recurrent product is split
  // by columns, reading its input's rows whole, and the others by whole tiles of rows
  // (codegen/TileRows.h, tileUnits), not by the even shares of per-row work.
  void emitBlock(const ir::Block& block, llvm::Value* batchRows, Work which = Work::All);

  void emitInstruction(const ir::Instr& instr, llvm::Value* batchRows);

  KernelEmitter kernels_;
  ProductKernelEmitter products_;
  CellPart part_;
};

std::unique_ptr<llvm::Module> CellEmitter::emit() {
  b.SetInsertPoint(llvm::BasicBlock::Create(llvmContext, "entry", fn));
  loadArguments(fn->getArg(0));
  if (part_ == CellPart::Setup) {
    emitSetup();
    b.CreateRetVoid();
    defineLoopWalks();
  } else {
    // The setup part first, on every thread, as if its phases were inline.
    llvm::FunctionCallee setup = module->getOrInsertFunction(
        setupFunctionName(fn->getName().str()),
        llvm::FunctionType::get(llvm::Type::getVoidTy(llvmContext), {ptr}, false));
    b.CreateCall(setup, {fn->getArg(0)});
    declareSetupWalks();
    emitLoop();
    b.CreateRetVoid();
  }
  return std::move(module);
}

// `emit` into a function of this module (named `suffix` after this one) that is then dropped:
// what stays is what it declared or defined on the way, the walks (EmitContext::TileWalks).
// The function, its insertion point, views and barrier state are this one's again after; the
// arguments loaded are the dropped function's, for the caller to load again where it goes on.
void CellEmitter::emitDropped(const char* suffix, const std::function<void()>& emit) {
  llvm::Function* kept = fn;
  const llvm::IRBuilderBase::InsertPoint keptAt = b.saveIP();
  const bool keptSynced = synced;
  fn = llvm::Function::Create(kept->getFunctionType(), llvm::Function::InternalLinkage,
                              kept->getName() + suffix, *module);
  fn->copyAttributesFrom(kept); // the target's CPU and features, which the walks copy
  views.clear();
  synced = true;
  b.SetInsertPoint(llvm::BasicBlock::Create(llvmContext, "entry", fn));
  loadArguments(fn->getArg(0));
  emit();
  b.CreateRetVoid();
  fn->eraseFromParent();
  fn = kept;
  views.clear();
  synced = keptSynced;
  b.restoreIP(keptAt);
}

// The time loop emitted and dropped (after the setup's return): what stays is the walks it
// defined on the way, which the loop part calls. The same emission as the loop part's, so the
// two agree on every walk's name.
void CellEmitter::defineLoopWalks() {
  emitDropped(".loop_walks", [&] { emitLoop(); });
}

// The setup part's walks declared in the loop part before its own, as the setup part defines
// them before the loop's: a walk of the loop that may take a setup walk of its shape
// (ProductKernelEmitter::emitTile: one that asks for next panels, where its own tile does not)
// then takes the same one in both parts. Only where its products and the loop's differ in
// asking: every other cell has nothing to share that way, and is spared the emission.
void CellEmitter::declareSetupWalks() {
  if (!ProductKernelEmitter::sharesPrefetchingWalks(target))
    return;
  bool asking = false, notAsking = false;
  for (const PackedProduct& packed : plan.packedProducts)
    (ProductKernelEmitter::asksForNextPanels(packed, target) ? asking : notAsking) = true;
  if (!asking || !notAsking)
    return;
  emitDropped(".setup_walks", [&] { emitSetup(); });
  loadArguments(fn->getArg(0)); // the loop goes on here
}

void CellEmitter::emitSetup() {
  // Parameters only: no view of an input or a sequence buffer is needed.
  ifPhase(RNNC_PHASE_PARAMS, "params", [&] {
    paramViews();
    emitBlock(cell.pre, constant(0), Work::WithoutBatch);
    paramViews();
    for (const PackedProduct& packed : plan.packedProducts)
      products_.emitPacking(packed);
    synced = false;
    barrier();
  });
  // The pre block: inputs and pre values are whole sequences, [T*B, F].
  sequenceViews();
  ifPhase(RNNC_PHASE_PRE, "pre", [&] {
    llvm::Value* sequenceRows = b.CreateMul(steps, batch, "rows");
    emitBlock(cell.pre, sequenceRows, Work::PerRow);
    // The loop reads pre rows by its own split of the batch, not the pre block's split.
    synced = false;
    barrier();
  });
}

void CellEmitter::emitLoop() {
  sequenceViews();
  ifPhase(RNNC_PHASE_LOOP, "loop", [&] {
    // Every step ends at a barrier (if it did anything after its last one), so the next one
    // starts in sync, as the first does (after the pre phase, or at the start of a call).
    forLoop(constant(0), steps, constant(1), "step", [&](llvm::Value* t) {
      synced = true;
      step = t;
      emitStep(t);
      step = nullptr;
    });
    // States read from the output rows during the loop get the last step's rows.
    synced = false;
    barrier();
    const int64_t outCols = columnsOf(cell.output);
    for (size_t i = 0; i < cell.updates.size(); ++i)
      if (plan.readFromOutput[i])
        ifThen(b.CreateICmpSGT(steps, constant(0)), "final_state", [&] {
          llvm::Value* lastRow = b.CreateMul(b.CreateSub(steps, constant(1)), batch);
          if (reverse) // the last step run is the first of the rows
            lastRow = b.CreateSelect(reverse, constant(0), lastRow);
          View last{b.CreateGEP(f32, output,
                                b.CreateAdd(b.CreateMul(lastRow, constant(outCols)),
                                            constant(plan.readFromOutputColumn[i]))),
                    constant(outCols)};
          const int64_t cols = columnsOf(cell.states[i].get());
          copyRows({states[i], constant(cols)}, last, share(batch), cols);
        });
  });
}

void CellEmitter::emitStep(llvm::Value* t) {
  View outputRows = stepViews(t);
  const int64_t outCols = columnsOf(cell.output);
  emitBlock(cell.step, batch);

  // Every read of this step's states is done before any thread overwrites them. The copies
  // below are split by rows like every kernel that wrote their sources.
  barrier();
  RowRange mine = share(batch);
  if (!plan.outputInPlace)
    copyRows(outputRows, view(cell.output), mine, outCols);
  // Stage next values that are read from states, then overwrite the states.
  std::vector<View> sources;
  for (size_t i = 0; i < cell.updates.size(); ++i) {
    const ir::Value* next = cell.updates[i].next;
    if (plan.updatedInKernel[i]) { // already stored over the state by its kernel
      sources.emplace_back();
      continue;
    }
    View source = view(next);
    if (plan.staging[i] >= 0) {
      View staged{buffers[static_cast<size_t>(plan.staging[i])], constant(columnsOf(next))};
      copyRows(staged, source, mine, columnsOf(next));
      source = staged;
    }
    sources.push_back(source);
  }
  for (size_t i = 0; i < cell.updates.size(); ++i)
    if (cell.updates[i].next != cell.updates[i].state && !plan.updatedInKernel[i] &&
        !plan.readFromOutput[i])
      copyRows(views.at(cell.states[i].get()), sources[i], mine, columnsOf(cell.states[i].get()));
  barrier(); // the next step reads these rows split its own way
}

void CellEmitter::emitBlock(const ir::Block& block, llvm::Value* batchRows, Work which) {
  for (const WorkUnit& unit : workUnits(block, plan)) {
    if ((which == Work::PerRow && unit.unbatched) ||
        (which == Work::WithoutBatch && !unit.unbatched))
      continue;
    // A product's rows (or columns) are not the even share per-row work takes.
    const bool product = unit.packed != nullptr;
    if (product)
      barrier();
    synced = false;
    const KernelGroup group{unit.first, unit.last};
    if (unit.kernel && unit.packed) // a kernel led by a matrix product
      products_.emitProductKernel(block, &group, *unit.packed, batchRows);
    else if (unit.kernel)
      kernels_.emitKernel(block, group, batchRows);
    else if (unit.packed)
      products_.emitProductKernel(block, nullptr, *unit.packed, batchRows);
    else
      emitInstruction(*block[unit.first], batchRows);
    if (product || unit.unbatched)
      barrier();
  }
}

void CellEmitter::emitInstruction(const ir::Instr& instr, llvm::Value* batchRows) {
  switch (instr.op) {
  case Op::Const:
  case Op::Slice:
    return; // immediates and views cost nothing until read
  case Op::Linear:
  case Op::MatMul: {
    const ir::Value* x = instr.operands[0];
    View a = view(x), w = view(instr.operands[1]), c = view(&instr.result);
    RowRange rows = rowsFor(x, batchRows);
    b.CreateCall(gemmFn,
                 {constant(instr.op == Op::Linear ? 1 : 0), b.CreateSub(rows.end, rows.begin),
                  constant(columnsOf(&instr.result)), constant(columnsOf(x)),
                  elementPointer(a, rows.begin, constant(0)), a.rowStride, w.base, w.rowStride,
                  elementPointer(c, rows.begin, constant(0)), c.rowStride});
    return;
  }
  case Op::LayerNorm: {
    const ir::Value* x = instr.operands[0];
    View in = view(x), out = view(&instr.result);
    RowRange rows = rowsFor(x, batchRows);
    b.CreateCall(layerNormFn, {b.CreateSub(rows.end, rows.begin), constant(columnsOf(x)),
                               elementPointer(in, rows.begin, constant(0)), in.rowStride,
                               elementPointer(out, rows.begin, constant(0)), out.rowStride,
                               llvm::ConstantFP::get(f32, instr.attrs.value)});
    return;
  }
  case Op::LayerNormGrad: {
    const ir::Value* x = instr.operands[0];
    View in = view(x), grad = view(instr.operands[1]), out = view(&instr.result);
    RowRange rows = rowsFor(x, batchRows);
    b.CreateCall(layerNormGradFn, {b.CreateSub(rows.end, rows.begin), constant(columnsOf(x)),
                                   elementPointer(in, rows.begin, constant(0)), in.rowStride,
                                   elementPointer(grad, rows.begin, constant(0)), grad.rowStride,
                                   elementPointer(out, rows.begin, constant(0)), out.rowStride,
                                   llvm::ConstantFP::get(f32, instr.attrs.value)});
    return;
  }
  case Op::DropoutMask: {
    // In the loop, this step's rows, one step of the call; in the pre phase, the call's steps *
    // batch rows, in the order of their steps (RnncDropoutMaskFunction).
    RNNC_INTERNAL_CHECK(maskSeed && maskRow, "dropout masks without their arguments");
    const ir::Value* x = instr.operands[0];
    View out = view(&instr.result);
    RowRange rows = rowsFor(x, batchRows);
    const bool inLoop = step != nullptr;
    llvm::Value* reversed = reverse && !inLoop ? b.CreateZExt(reverse, i64) : constant(0);
    b.CreateCall(dropoutMaskFn,
                 {b.CreateSub(rows.end, rows.begin), constant(columnsOf(x)),
                  elementPointer(out, rows.begin, constant(0)), out.rowStride, rows.begin,
                  inLoop ? constant(1) : steps, batch, reversed,
                  inLoop ? b.CreateAdd(maskRow, b.CreateMul(step, batch)) : maskRow, maskSeed,
                  constant(static_cast<int64_t>(instr.attrs.stream)),
                  llvm::ConstantFP::get(llvm::Type::getDoubleTy(llvmContext), instr.attrs.value)});
    return;
  }
  case Op::Concat: {
    View out = view(&instr.result);
    // Where this concat lies in the output rows, if it does: parts already stored in these
    // columns by the kernels that computed them need no copy.
    std::optional<int64_t> first;
    if (&instr.result == cell.output)
      first = 0;
    else if (auto placed = plan.inOutputColumns.find(&instr.result);
             placed != plan.inOutputColumns.end())
      first = placed->second;
    int64_t col = 0;
    for (const ir::Value* part : instr.operands) {
      const auto placed = plan.inOutputColumns.find(part);
      if (!first || placed == plan.inOutputColumns.end() || placed->second != *first + col) {
        View to{b.CreateConstGEP1_64(f32, out.base, static_cast<uint64_t>(col)), out.rowStride};
        copyRows(to, view(part), rowsFor(&instr.result, batchRows), columnsOf(part));
      }
      col += columnsOf(part);
    }
    return;
  }
  case Op::Stack: {
    View out = view(&instr.result);
    int64_t row = 0;
    for (const ir::Value* part : instr.operands) {
      int64_t rows = fixedRowsOf(part);
      View to{b.CreateGEP(f32, out.base, b.CreateMul(constant(row), out.rowStride)), out.rowStride};
      copyRows(to, view(part), firstThreadOnly(constant(rows)), columnsOf(part));
      row += rows;
    }
    return;
  }
  // Elementwise ops run in kernels (a lone one is a kernel of one). No default: a new op in
  // Ops.def is a compile error (-Werror=switch) until it is placed.
  case Op::Add:
  case Op::Sub:
  case Op::Mul:
  case Op::Div:
  case Op::Min:
  case Op::Max:
  case Op::Neg:
  case Op::Sigmoid:
  case Op::Tanh:
  case Op::Relu:
  case Op::Exp:
  case Op::Log:
  case Op::Sqrt:
  case Op::Clamp:
  case Op::Dropout:
  case Op::Step:
    break;
  }
  RNNC_INTERNAL_CHECK(false,
                      "no code for " + std::string(ir::opName(instr.op)) + " outside a kernel");
}

} // namespace

std::string setupFunctionName(const std::string& functionName) {
  return functionName + ".setup";
}

std::unique_ptr<llvm::Module> emitCell(llvm::LLVMContext& context, const ir::Cell& cell,
                                       const StoragePlan& plan, const Target& target,
                                       const std::string& functionName, CellPart part) {
  return CellEmitter(context, cell, plan, target, functionName, part).emit();
}

} // namespace rnnc::codegen

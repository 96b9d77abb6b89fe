#include "codegen/CellEmitter.h"

#include "codegen/EmitContext.h"
#include "codegen/KernelEmitter.h"
#include "codegen/ProductKernelEmitter.h"
#include "ir/Error.h"

#include <algorithm>
#include <cstddef>

namespace rnnc::codegen {

using ir::Op;

namespace {

// The cell's part of the code generator: the arguments, the phases, the time loop and its
// steps, and the blocks' instructions; kernels and matrix products are left to their parts.
class CellEmitter : public EmitContext {
public:
  CellEmitter(llvm::LLVMContext& llvmContext, const ir::Cell& cell, const StoragePlan& plan,
              const Target& target, const std::string& name)
      : EmitContext(llvmContext, cell, plan, target, name), kernels_(*this),
        products_(*this, kernels_) {}

  std::unique_ptr<llvm::Module> emit();

private:
  std::vector<llvm::Value*> loadPointerArray(llvm::Value* array, size_t count, const char* name);

  // The run's arguments, each read at its offset in RnncRunArgs (RunArgs.h): one layout, the C
  // struct's.
  void loadArguments();

  // Views valid everywhere: parameters and fixed-size buffers.
  void resetViews();

  void emitStep(llvm::Value* t);

  // Which of a block's work to emit: the pre block's is split between the parameter phase
  // (no batch dimension) and the pre phase (per row).
  enum class Work { All, PerRow, WithoutBatch };

  // Work split by rows may follow work split by the same rows without a barrier; a fused
  // product (split by columns, reading its input's rows whole) and work done on thread 0 alone
  // are fenced on both sides.
  void emitBlock(const ir::Block& block, llvm::Value* batchRows, Work which = Work::All);

  void emitInstruction(const ir::Instr& instr, llvm::Value* batchRows);

  KernelEmitter kernels_;
  ProductKernelEmitter products_;
};

std::unique_ptr<llvm::Module> CellEmitter::emit() {
  b.SetInsertPoint(llvm::BasicBlock::Create(llvmContext, "entry", fn));
  loadArguments();

  // Parameters only: no view of an input or a sequence buffer is needed.
  ifPhase(RNNC_PHASE_PARAMS, "params", [&] {
    resetViews();
    emitBlock(cell.pre, constant(0), Work::WithoutBatch);
    resetViews();
    for (const PackedProduct& packed : plan.packedProducts)
      products_.emitPacking(packed);
    synced = false;
    barrier();
  });
  // The pre block: inputs and pre values are whole sequences, [T*B, F].
  resetViews();
  for (size_t i = 0; i < cell.inputs.size(); ++i)
    views[cell.inputs[i].get()] = {inputs[i], constant(columnsOf(cell.inputs[i].get()))};
  for (const BufferSpec& spec : plan.buffers)
    if (spec.rows == Rows::Sequence)
      views[spec.value] = {buffers[index(spec)], constant(spec.cols)};
  ifPhase(RNNC_PHASE_PRE, "pre", [&] {
    llvm::Value* sequenceRows = b.CreateMul(steps, batch, "rows");
    emitBlock(cell.pre, sequenceRows, Work::PerRow);
    // The loop reads pre rows by its own split of the batch, not the pre block's split.
    synced = false;
    barrier();
  });
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
          View last{b.CreateGEP(f32, output, b.CreateMul(lastRow, constant(outCols))),
                    constant(outCols)};
          copyRows({states[i], constant(outCols)}, last, share(batch), outCols);
        });
  });
  b.CreateRetVoid();
  return std::move(module);
}

std::vector<llvm::Value*> CellEmitter::loadPointerArray(llvm::Value* array, size_t count,
                                                        const char* name) {
  std::vector<llvm::Value*> pointers;
  for (size_t i = 0; i < count; ++i) {
    llvm::Value* slot = b.CreateConstGEP1_64(ptr, array, i);
    pointers.push_back(b.CreateLoad(ptr, slot, std::string(name) + std::to_string(i)));
  }
  return pointers;
}

void CellEmitter::loadArguments() {
  llvm::Value* args = fn->getArg(0);
  // Each field at its offset in the C struct, so the two cannot disagree.
  auto field = [&](size_t offset, llvm::Type* type, const char* name) {
    llvm::Value* at = b.CreateConstGEP1_64(llvm::Type::getInt8Ty(llvmContext), args, offset);
    return b.CreateLoad(type, at, name);
  };
#define RNNC_FIELD(name, type) field(offsetof(RnncRunArgs, name), type, #name)
  static_assert(sizeof(int64_t) == 8 && sizeof(void*) == 8,
                "RnncRunArgs as a 64-bit target lays it out");
  steps = RNNC_FIELD(steps, i64);
  batch = RNNC_FIELD(batch, i64);
  params = loadPointerArray(RNNC_FIELD(params, ptr), cell.params.size(), "param");
  inputs = loadPointerArray(RNNC_FIELD(inputs, ptr), cell.inputs.size(), "input");
  states = loadPointerArray(RNNC_FIELD(states, ptr), cell.states.size(), "state");
  output = RNNC_FIELD(output, ptr);
  buffers = loadPointerArray(RNNC_FIELD(buffers, ptr), plan.buffers.size(), "buffer");
  phases = RNNC_FIELD(phases, i64);
  thread = RNNC_FIELD(thread, i64);
  threads = RNNC_FIELD(threads, i64);
  team = RNNC_FIELD(team, ptr);
#undef RNNC_FIELD
}

// Views valid everywhere: parameters and fixed-size buffers.
void CellEmitter::resetViews() {
  views.clear();
  for (size_t i = 0; i < cell.params.size(); ++i) {
    const ir::Value* p = cell.params[i].get();
    views[p] = {params[i], constant(p->shape.size() == 2 ? columnsOf(p) : 0)};
  }
  for (const BufferSpec& spec : plan.buffers)
    if (spec.rows == Rows::Fixed && !spec.packedWeights)
      views[spec.value] = {buffers[index(spec)],
                           constant(spec.value->shape.size() == 2 ? spec.cols : 0)};
}

void CellEmitter::emitStep(llvm::Value* t) {
  resetViews();
  llvm::Value* firstRow = b.CreateMul(t, batch, "first_row");
  auto rowsFrom = [&](llvm::Value* base, int64_t cols) {
    return View{b.CreateGEP(f32, base, b.CreateMul(firstRow, constant(cols))), constant(cols)};
  };
  for (size_t i = 0; i < cell.inputs.size(); ++i)
    views[cell.inputs[i].get()] = rowsFrom(inputs[i], columnsOf(cell.inputs[i].get()));
  const int64_t outCols = columnsOf(cell.output);
  for (size_t i = 0; i < cell.states.size(); ++i) {
    llvm::Value* base = states[i];
    if (plan.readFromOutput[i]) { // step t > 0 reads the state from output rows t - 1
      llvm::Value* previous =
          b.CreateGEP(f32, output, b.CreateMul(b.CreateSub(firstRow, batch), constant(outCols)));
      base = b.CreateSelect(b.CreateICmpEQ(t, constant(0)), base, previous);
    }
    views[cell.states[i].get()] = {base, constant(columnsOf(cell.states[i].get()))};
  }
  for (const BufferSpec& spec : plan.buffers)
    if (spec.rows == Rows::Sequence)
      views[spec.value] = rowsFrom(buffers[index(spec)], spec.cols);
    else if (spec.rows == Rows::Step && !views.count(spec.value))
      views[spec.value] = {buffers[index(spec)], constant(spec.cols)};
  View outputRows = rowsFrom(output, outCols);
  if (plan.outputInPlace)
    views[cell.output] = outputRows;

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
  std::vector<KernelGroup> groups = kernelGroups(block);
  size_t nextGroup = 0;
  for (size_t i = 0; i < block.size();) {
    size_t end = i + 1;
    bool isGroup = nextGroup < groups.size() && groups[nextGroup].first == i;
    if (isGroup)
      end = groups[nextGroup].last;
    // Immediates and views cost nothing until read, alone or as a whole kernel (a kernel of
    // the slices of a premultiplied product, read raw by the step).
    bool viewsOnly = true;
    for (size_t j = i; j < end; ++j)
      viewsOnly &= block[j]->op == Op::Const || block[j]->op == Op::Slice;
    if (viewsOnly) {
      if (isGroup)
        ++nextGroup;
      i = end;
      continue;
    }
    // The recurrent product is split by columns, every other product by rows like per-row work.
    const PackedProduct* packed = plan.packedProductOf(block[i].get());
    bool product = packed && !packed->splitRows;
    bool unbatched = true; // every value the work writes is without a batch dimension
    for (size_t j = i; j < end; ++j)
      if (block[j]->op != Op::Const && block[j]->op != Op::Slice)
        unbatched &= !block[j]->result.isBatched();
    unbatched &= !packed;
    if ((which == Work::PerRow && unbatched) || (which == Work::WithoutBatch && !unbatched)) {
      if (isGroup)
        ++nextGroup;
      i = end;
      continue;
    }
    if (product)
      barrier();
    synced = false;
    if (isGroup && packed) // a kernel led by a matrix product
      products_.emitProductKernel(block, &groups[nextGroup++], *packed, batchRows);
    else if (isGroup)
      kernels_.emitKernel(block, groups[nextGroup++], batchRows);
    else if (packed)
      products_.emitProductKernel(block, nullptr, *packed, batchRows);
    else
      emitInstruction(*block[i], batchRows);
    if (product || unbatched)
      barrier();
    i = end;
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
  case Op::Concat: {
    View out = view(&instr.result);
    int64_t col = 0;
    for (const ir::Value* part : instr.operands) {
      View to{b.CreateConstGEP1_64(f32, out.base, static_cast<uint64_t>(col)), out.rowStride};
      copyRows(to, view(part), rowsFor(&instr.result, batchRows), columnsOf(part));
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

std::unique_ptr<llvm::Module> emitCell(llvm::LLVMContext& context, const ir::Cell& cell,
                                       const StoragePlan& plan, const Target& target,
                                       const std::string& functionName) {
  return CellEmitter(context, cell, plan, target, functionName).emit();
}

} // namespace rnnc::codegen

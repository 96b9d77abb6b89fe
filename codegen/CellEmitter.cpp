#include "codegen/Emitter.h"

#include "codegen/CellEmitter.h"
#include "ir/Error.h"

#include <algorithm>

namespace rnnc::codegen {

using ir::Op;

std::unique_ptr<llvm::Module> Emitter::emit() {
  b_.SetInsertPoint(llvm::BasicBlock::Create(context_, "entry", fn_));
  loadArguments();

  // Parameters only: no view of an input or a sequence buffer is needed.
  ifPhase(RNNC_PHASE_PARAMS, "params", [&] {
    resetViews();
    emitBlock(cell_.pre, constant(0), Work::WithoutBatch);
    resetViews();
    for (const PackedProduct& packed : plan_.packedProducts)
      emitPacking(packed);
    synced_ = false;
    barrier();
  });
  // The pre block: inputs and pre values are whole sequences, [T*B, F].
  resetViews();
  for (size_t i = 0; i < cell_.inputs.size(); ++i)
    views_[cell_.inputs[i].get()] = {inputs_[i], constant(columnsOf(cell_.inputs[i].get()))};
  for (const BufferSpec& spec : plan_.buffers)
    if (spec.rows == Rows::Sequence)
      views_[spec.value] = {buffers_[index(spec)], constant(spec.cols)};
  ifPhase(RNNC_PHASE_PRE, "pre", [&] {
    llvm::Value* sequenceRows = b_.CreateMul(steps_, batch_, "rows");
    emitBlock(cell_.pre, sequenceRows, Work::PerRow);
    // The loop reads pre rows by its own split of the batch, not the pre block's split.
    synced_ = false;
    barrier();
  });
  ifPhase(RNNC_PHASE_LOOP, "loop", [&] {
    // Every step ends at a barrier (if it did anything after its last one), so the next one
    // starts in sync, as the first does (after the pre phase, or at the start of a call).
    forLoop(constant(0), steps_, constant(1), "step", [&](llvm::Value* t) {
      synced_ = true;
      step_ = t;
      emitStep(t);
      step_ = nullptr;
    });
    // States read from the output rows during the loop get the last step's rows.
    synced_ = false;
    barrier();
    const int64_t outCols = columnsOf(cell_.output);
    for (size_t i = 0; i < cell_.updates.size(); ++i)
      if (plan_.readFromOutput[i])
        ifThen(b_.CreateICmpSGT(steps_, constant(0)), "final_state", [&] {
          llvm::Value* lastRow = b_.CreateMul(b_.CreateSub(steps_, constant(1)), batch_);
          View last{b_.CreateGEP(f32_, output_, b_.CreateMul(lastRow, constant(outCols))),
                    constant(outCols)};
          copyRows({states_[i], constant(outCols)}, last, share(batch_), outCols);
        });
  });
  b_.CreateRetVoid();
  return std::move(module_);
}

std::vector<llvm::Value*> Emitter::loadPointerArray(llvm::Value* array, size_t count,
                                                    const char* name) {
  std::vector<llvm::Value*> pointers;
  for (size_t i = 0; i < count; ++i) {
    llvm::Value* slot = b_.CreateConstGEP1_64(ptr_, array, i);
    pointers.push_back(b_.CreateLoad(ptr_, slot, std::string(name) + std::to_string(i)));
  }
  return pointers;
}

void Emitter::loadArguments() {
  llvm::StructType* argsType = llvm::StructType::get(
      context_, {i64_, i64_, ptr_, ptr_, ptr_, ptr_, ptr_, i64_, i64_, i64_, ptr_});
  llvm::Value* args = fn_->getArg(0);
  auto field = [&](unsigned i, llvm::Type* type, const char* name) {
    return b_.CreateLoad(type, b_.CreateStructGEP(argsType, args, i), name);
  };
  steps_ = field(0, i64_, "steps");
  batch_ = field(1, i64_, "batch");
  params_ = loadPointerArray(field(2, ptr_, "params"), cell_.params.size(), "param");
  inputs_ = loadPointerArray(field(3, ptr_, "inputs"), cell_.inputs.size(), "input");
  states_ = loadPointerArray(field(4, ptr_, "states"), cell_.states.size(), "state");
  output_ = field(5, ptr_, "output");
  buffers_ = loadPointerArray(field(6, ptr_, "buffers"), plan_.buffers.size(), "buffer");
  phases_ = field(7, i64_, "phases");
  thread_ = field(8, i64_, "thread");
  threads_ = field(9, i64_, "threads");
  team_ = field(10, ptr_, "team");
}

// Views valid everywhere: parameters and fixed-size buffers.
void Emitter::resetViews() {
  views_.clear();
  for (size_t i = 0; i < cell_.params.size(); ++i) {
    const ir::Value* p = cell_.params[i].get();
    views_[p] = {params_[i], constant(p->shape.size() == 2 ? columnsOf(p) : 0)};
  }
  for (const BufferSpec& spec : plan_.buffers)
    if (spec.rows == Rows::Fixed && !spec.packedWeights)
      views_[spec.value] = {buffers_[index(spec)],
                            constant(spec.value->shape.size() == 2 ? spec.cols : 0)};
}

View Emitter::view(const ir::Value* value) {
  if (auto it = views_.find(value); it != views_.end())
    return it->second;
  RNNC_INTERNAL_CHECK(!value->isArgument() && value->def->op == Op::Slice,
                      "no storage for a value the generated code reads");
  View source = view(value->def->operands[0]);
  int64_t offset = value->def->attrs.offset.constantValue();
  View sliced{b_.CreateConstGEP1_64(f32_, source.base, static_cast<uint64_t>(offset)),
              source.rowStride};
  views_[value] = sliced;
  return sliced;
}

void Emitter::barrier() {
  if (synced_)
    return;
  ifThen(b_.CreateICmpSGT(threads_, constant(1)), "barrier",
         [&] { b_.CreateCall(barrier_, {team_}); });
  synced_ = true;
}

void Emitter::copyRows(const View& to, const View& from, RowRange rows, int64_t cols) {
  synced_ = false;
  forLoop(rows.begin, rows.end, constant(1), "copy", [&](llvm::Value* r) {
    b_.CreateMemCpy(elementPointer(to, r, constant(0)), llvm::Align(4),
                    elementPointer(from, r, constant(0)), llvm::Align(4),
                    constant(cols * static_cast<int64_t>(sizeof(float))));
  });
}

void Emitter::emitStep(llvm::Value* t) {
  resetViews();
  llvm::Value* firstRow = b_.CreateMul(t, batch_, "first_row");
  auto rowsFrom = [&](llvm::Value* base, int64_t cols) {
    return View{b_.CreateGEP(f32_, base, b_.CreateMul(firstRow, constant(cols))), constant(cols)};
  };
  for (size_t i = 0; i < cell_.inputs.size(); ++i)
    views_[cell_.inputs[i].get()] = rowsFrom(inputs_[i], columnsOf(cell_.inputs[i].get()));
  const int64_t outCols = columnsOf(cell_.output);
  for (size_t i = 0; i < cell_.states.size(); ++i) {
    llvm::Value* base = states_[i];
    if (plan_.readFromOutput[i]) { // step t > 0 reads the state from output rows t - 1
      llvm::Value* previous = b_.CreateGEP(
          f32_, output_, b_.CreateMul(b_.CreateSub(firstRow, batch_), constant(outCols)));
      base = b_.CreateSelect(b_.CreateICmpEQ(t, constant(0)), base, previous);
    }
    views_[cell_.states[i].get()] = {base, constant(columnsOf(cell_.states[i].get()))};
  }
  for (const BufferSpec& spec : plan_.buffers)
    if (spec.rows == Rows::Sequence)
      views_[spec.value] = rowsFrom(buffers_[index(spec)], spec.cols);
    else if (spec.rows == Rows::Step && !views_.count(spec.value))
      views_[spec.value] = {buffers_[index(spec)], constant(spec.cols)};
  View outputRows = rowsFrom(output_, outCols);
  if (plan_.outputInPlace)
    views_[cell_.output] = outputRows;

  emitBlock(cell_.step, batch_);

  // Every read of this step's states is done before any thread overwrites them. The copies
  // below are split by rows like every kernel that wrote their sources.
  barrier();
  RowRange mine = share(batch_);
  if (!plan_.outputInPlace)
    copyRows(outputRows, view(cell_.output), mine, outCols);
  // Stage next values that are read from states, then overwrite the states.
  std::vector<View> sources;
  for (size_t i = 0; i < cell_.updates.size(); ++i) {
    const ir::Value* next = cell_.updates[i].next;
    if (plan_.updatedInKernel[i]) { // already stored over the state by its kernel
      sources.emplace_back();
      continue;
    }
    View source = view(next);
    if (plan_.staging[i] >= 0) {
      View staged{buffers_[static_cast<size_t>(plan_.staging[i])], constant(columnsOf(next))};
      copyRows(staged, source, mine, columnsOf(next));
      source = staged;
    }
    sources.push_back(source);
  }
  for (size_t i = 0; i < cell_.updates.size(); ++i)
    if (cell_.updates[i].next != cell_.updates[i].state && !plan_.updatedInKernel[i] &&
        !plan_.readFromOutput[i])
      copyRows(views_.at(cell_.states[i].get()), sources[i], mine,
               columnsOf(cell_.states[i].get()));
  barrier(); // the next step reads these rows split its own way
}

void Emitter::emitBlock(const ir::Block& block, llvm::Value* batchRows, Work which) {
  std::vector<KernelGroup> groups = kernelGroups(block);
  size_t nextGroup = 0;
  for (size_t i = 0; i < block.size();) {
    size_t end = i + 1;
    bool isGroup = nextGroup < groups.size() && groups[nextGroup].first == i;
    if (isGroup)
      end = groups[nextGroup].last;
    if (!isGroup && (block[i]->op == Op::Const || block[i]->op == Op::Slice)) {
      ++i; // no code
      continue;
    }
    // The recurrent product is split by columns, every other product by rows like per-row work.
    const PackedProduct* packed = plan_.packedProductOf(block[i].get());
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
    synced_ = false;
    if (isGroup)
      emitKernel(block, groups[nextGroup++], batchRows);
    else if (packed)
      emitProductKernel(block, nullptr, *packed, batchRows);
    else
      emitInstruction(*block[i], batchRows);
    if (product || unbatched)
      barrier();
    i = end;
  }
}

void Emitter::emitInstruction(const ir::Instr& instr, llvm::Value* batchRows) {
  switch (instr.op) {
  case Op::Const:
  case Op::Slice:
    return; // immediates and views cost nothing until read
  case Op::Linear:
  case Op::MatMul: {
    const ir::Value* x = instr.operands[0];
    View a = view(x), w = view(instr.operands[1]), c = view(&instr.result);
    RowRange rows = rowsFor(x, batchRows);
    b_.CreateCall(gemm_,
                  {constant(instr.op == Op::Linear ? 1 : 0), b_.CreateSub(rows.end, rows.begin),
                   constant(columnsOf(&instr.result)), constant(columnsOf(x)),
                   elementPointer(a, rows.begin, constant(0)), a.rowStride, w.base, w.rowStride,
                   elementPointer(c, rows.begin, constant(0)), c.rowStride});
    return;
  }
  case Op::LayerNorm: {
    const ir::Value* x = instr.operands[0];
    View in = view(x), out = view(&instr.result);
    RowRange rows = rowsFor(x, batchRows);
    b_.CreateCall(layerNorm_, {b_.CreateSub(rows.end, rows.begin), constant(columnsOf(x)),
                               elementPointer(in, rows.begin, constant(0)), in.rowStride,
                               elementPointer(out, rows.begin, constant(0)), out.rowStride,
                               llvm::ConstantFP::get(f32_, instr.attrs.value)});
    return;
  }
  case Op::Concat: {
    View out = view(&instr.result);
    int64_t col = 0;
    for (const ir::Value* part : instr.operands) {
      View to{b_.CreateConstGEP1_64(f32_, out.base, static_cast<uint64_t>(col)), out.rowStride};
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
      View to{b_.CreateGEP(f32_, out.base, b_.CreateMul(constant(row), out.rowStride)),
              out.rowStride};
      copyRows(to, view(part), firstThreadOnly(constant(rows)), columnsOf(part));
      row += rows;
    }
    return;
  }
  default:
    RNNC_INTERNAL_CHECK(false,
                        "no code for " + std::string(ir::opName(instr.op)) + " outside a kernel");
  }
}

std::unique_ptr<llvm::Module> emitCell(llvm::LLVMContext& context, const ir::Cell& cell,
                                       const StoragePlan& plan, const Target& target,
                                       const std::string& functionName) {
  return Emitter(context, cell, plan, target, functionName).emit();
}

} // namespace rnnc::codegen

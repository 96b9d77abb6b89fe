#include "codegen/EmitContext.h"

#include "ir/Error.h"

#include <cstddef>

namespace rnnc::codegen {

EmitContext::EmitContext(llvm::LLVMContext& llvmContext, const ir::Cell& cell,
                         const StoragePlan& plan, const Target& target, const std::string& name)
    : llvmContext(llvmContext), cell(cell), plan(plan), target(target),
      module(std::make_unique<llvm::Module>("rnnc_" + cell.name, llvmContext)), b(llvmContext) {
  module->setTargetTriple(target.triple);
  f32 = llvm::Type::getFloatTy(llvmContext);
  i64 = llvm::Type::getInt64Ty(llvmContext);
  ptr = llvm::PointerType::get(llvmContext, 0);
  auto* fnType = llvm::FunctionType::get(llvm::Type::getVoidTy(llvmContext), {ptr}, false);
  fn = llvm::Function::Create(fnType, llvm::Function::ExternalLinkage, name, *module);
  fn->addFnAttr("target-cpu", target.cpu);
  fn->addFnAttr("target-features", target.features);
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  llvm::Type* none = llvm::Type::getVoidTy(llvmContext);
  gemmFn = module->getOrInsertFunction(
      kGemmSymbol,
      llvm::FunctionType::get(none, {i64, i64, i64, i64, ptr, i64, ptr, i64, ptr, i64}, false));
  barrierFn =
      module->getOrInsertFunction(kBarrierSymbol, llvm::FunctionType::get(none, {ptr}, false));
  // Helpers whose memory effects LLVM is told, so that loads may move past their calls (and
  // pure ones leave loops): they never throw and always return.
  auto declareHelper = [&](const char* symbol, llvm::FunctionType* type,
                           llvm::MemoryEffects effects, bool speculatable) {
    llvm::FunctionCallee callee = module->getOrInsertFunction(symbol, type);
    if (auto* helper = llvm::dyn_cast<llvm::Function>(callee.getCallee())) {
      helper->setMemoryEffects(effects);
      helper->setDoesNotThrow();
      helper->setWillReturn();
      if (speculatable)
        helper->addFnAttr(llvm::Attribute::Speculatable);
    }
    return callee;
  };
  // The work balance's helpers touch no memory the generated code writes (their shares change
  // inside barriers, calls LLVM knows nothing of): rnnc_share_start reads the shares,
  // rnnc_share_clock only its clocks.
  llvm::FunctionType* balanceType = llvm::FunctionType::get(i64, {ptr, i64, i64}, false);
  shareStartFn = declareHelper(kShareStartSymbol, balanceType, llvm::MemoryEffects::readOnly(),
                               /*speculatable=*/false);
  shareClockFn =
      declareHelper(kShareClockSymbol, llvm::FunctionType::get(none, {ptr, i64, i64}, false),
                    llvm::MemoryEffects::inaccessibleMemOnly(), /*speculatable=*/false);
  // The tile split (RunArgs.h) is a pure function of its arguments: calls with the same ones
  // merge, and leave loops that do not change them.
  llvm::FunctionType* splitType = llvm::FunctionType::get(i64, {i64, i64, i64}, false);
  tileSplitFn = declareHelper(kTileSplitSymbol, splitType, llvm::MemoryEffects::none(),
                              /*speculatable=*/true);
  tileUnitStartFn = declareHelper(kTileUnitStartSymbol, splitType, llvm::MemoryEffects::none(),
                                  /*speculatable=*/true);
  packWeightsFn = module->getOrInsertFunction(
      kPackWeightsSymbol,
      llvm::FunctionType::get(none, {ptr, ptr, i64, ptr, ptr, i64, i64}, false));
  layerNormFn = module->getOrInsertFunction(
      kLayerNormSymbol, llvm::FunctionType::get(none, {i64, i64, ptr, i64, ptr, i64, f32}, false));
  dropoutMaskFn = module->getOrInsertFunction(
      kDropoutMaskSymbol, llvm::FunctionType::get(none,
                                                  {i64, i64, ptr, i64, i64, i64, i64, i64, i64, i64,
                                                   i64, llvm::Type::getDoubleTy(llvmContext)},
                                                  false));
  layerNormGradFn = module->getOrInsertFunction(
      kLayerNormGradSymbol,
      llvm::FunctionType::get(none, {i64, i64, ptr, i64, ptr, i64, ptr, i64, f32}, false));
}

std::vector<llvm::Value*> EmitContext::loadPointerArray(llvm::Value* array, size_t count,
                                                        const char* name) {
  std::vector<llvm::Value*> pointers;
  for (size_t i = 0; i < count; ++i) {
    llvm::Value* slot = b.CreateConstGEP1_64(ptr, array, i);
    pointers.push_back(b.CreateLoad(ptr, slot, std::string(name) + std::to_string(i)));
  }
  return pointers;
}

void EmitContext::loadArguments(llvm::Value* args) {
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
  inputStrides.clear();
  if (!denseInputs && ir::containsOp(cell, ir::Op::DropoutMask)) {
    maskSeed = RNNC_FIELD(maskSeed, i64);
    maskRow = RNNC_FIELD(maskRow, i64);
  }
  reverse =
      denseInputs ? nullptr : b.CreateICmpNE(RNNC_FIELD(reverse, i64), constant(0), "reverse");
  if (denseInputs) {
    for (const auto& input : cell.inputs)
      inputStrides.push_back(constant(columnsOf(input.get())));
  } else {
    llvm::Value* strides = RNNC_FIELD(inputStrides, ptr);
    for (size_t i = 0; i < cell.inputs.size(); ++i)
      inputStrides.push_back(b.CreateLoad(i64, b.CreateConstGEP1_64(i64, strides, i),
                                          "input_stride" + std::to_string(i)));
  }
#undef RNNC_FIELD
}

// Views valid everywhere: parameters and fixed-size buffers.
void EmitContext::paramViews() {
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

void EmitContext::sequenceViews() {
  paramViews();
  for (size_t i = 0; i < cell.inputs.size(); ++i)
    views[cell.inputs[i].get()] = {inputs[i], inputStrides[i]};
  for (const BufferSpec& spec : plan.buffers)
    if (spec.rows == Rows::Sequence)
      views[spec.value] = {buffers[index(spec)], constant(spec.cols)};
}

View EmitContext::stepViews(llvm::Value* t) {
  paramViews();
  // The rows of the step the loop's step t is: t, or counted from the end in reverse.
  llvm::Value* rowStep =
      reverse ? b.CreateSelect(reverse, b.CreateSub(b.CreateSub(steps, constant(1)), t), t) : t;
  llvm::Value* firstRow = b.CreateMul(rowStep, batch, "first_row");
  auto rowsFrom = [&](llvm::Value* base, llvm::Value* stride) {
    return View{b.CreateGEP(f32, base, b.CreateMul(firstRow, stride)), stride};
  };
  for (size_t i = 0; i < cell.inputs.size(); ++i)
    views[cell.inputs[i].get()] = rowsFrom(inputs[i], inputStrides[i]);
  const int64_t outCols = columnsOf(cell.output);
  for (size_t i = 0; i < cell.states.size(); ++i) {
    llvm::Value* base = states[i];
    const int64_t cols = columnsOf(cell.states[i].get());
    llvm::Value* stride = constant(cols);
    if (plan.readFromOutput[i]) { // step t > 0 reads the state from the previous step's rows
      llvm::Value* previousRow = b.CreateSub(firstRow, batch);
      if (reverse)
        previousRow = b.CreateSelect(reverse, b.CreateAdd(firstRow, batch), previousRow);
      llvm::Value* previous = b.CreateGEP(f32, output,
                                          b.CreateAdd(b.CreateMul(previousRow, constant(outCols)),
                                                      constant(plan.readFromOutputColumn[i])));
      llvm::Value* first = b.CreateICmpEQ(t, constant(0));
      base = b.CreateSelect(first, base, previous);
      if (cols != outCols) // columns of wider output rows
        stride = b.CreateSelect(first, stride, constant(outCols));
    }
    views[cell.states[i].get()] = {base, stride};
  }
  for (const BufferSpec& spec : plan.buffers)
    if (spec.rows == Rows::Sequence)
      views[spec.value] = rowsFrom(buffers[index(spec)], constant(spec.cols));
    else if (spec.rows == Rows::Step && !views.count(spec.value))
      views[spec.value] = {buffers[index(spec)], constant(spec.cols)};
  View outputRows = rowsFrom(output, constant(outCols));
  if (plan.outputInPlace)
    views[cell.output] = outputRows;
  for (const auto& [value, column] : plan.inOutputColumns)
    views[value] = {b.CreateConstGEP1_64(f32, outputRows.base, static_cast<uint64_t>(column)),
                    outputRows.rowStride};
  return outputRows;
}

View EmitContext::view(const ir::Value* value) {
  if (auto it = views.find(value); it != views.end())
    return it->second;
  RNNC_INTERNAL_CHECK(!value->isArgument() && value->def->op == ir::Op::Slice,
                      "no storage for a value the generated code reads");
  View source = view(value->def->operands[0]);
  int64_t offset = value->def->attrs.offset.constantValue();
  View sliced{b.CreateConstGEP1_64(f32, source.base, static_cast<uint64_t>(offset)),
              source.rowStride};
  views[value] = sliced;
  return sliced;
}

EmitContext::OpenLoop EmitContext::openLoop(llvm::Value* begin, const std::string& name) {
  llvm::BasicBlock* before = b.GetInsertBlock();
  auto* header = llvm::BasicBlock::Create(llvmContext, name, fn);
  auto* exit = llvm::BasicBlock::Create(llvmContext, name + ".exit", fn);
  b.CreateBr(header);
  b.SetInsertPoint(header);
  llvm::PHINode* counter = b.CreatePHI(i64, 2, name + ".i");
  counter->addIncoming(begin, before);
  return {counter, header, exit};
}

void EmitContext::disableUnrolling(llvm::BranchInst* latch) {
  llvm::MDNode* disable =
      llvm::MDNode::get(llvmContext, llvm::MDString::get(llvmContext, "llvm.loop.unroll.disable"));
  llvm::MDNode* loopId = llvm::MDNode::getDistinct(llvmContext, {nullptr, disable});
  loopId->replaceOperandWith(0, loopId);
  latch->setMetadata(llvm::LLVMContext::MD_loop, loopId);
}

void EmitContext::barrier() {
  if (synced)
    return;
  ifThen(b.CreateICmpSGT(threads, constant(1)), "barrier",
         [&] { b.CreateCall(barrierFn, {team}); });
  synced = true;
}

void EmitContext::copyRows(const View& to, const View& from, RowRange rows, int64_t cols) {
  synced = false;
  forLoop(rows.begin, rows.end, constant(1), "copy", [&](llvm::Value* r) {
    b.CreateMemCpy(elementPointer(to, r, constant(0)), llvm::Align(4),
                   elementPointer(from, r, constant(0)), llvm::Align(4),
                   constant(cols * static_cast<int64_t>(sizeof(float))));
  });
}

EmitContext::TileRows::TileRows(EmitContext& e, const View& v, llvm::Value* firstRow, int64_t rows)
    : e(e) {
  if (auto* constant = llvm::dyn_cast<llvm::ConstantInt>(v.rowStride))
    stride = constant->getSExtValue();
  for (int64_t m = 0; m < (stride ? 1 : rows); ++m)
    pointers.push_back(e.elementPointer(v, e.b.CreateAdd(firstRow, e.constant(m)), e.constant(0)));
}

llvm::Value* EmitContext::TileRows::at(int64_t m, llvm::Type* element, llvm::Value* index) const {
  if (!stride)
    return e.b.CreateGEP(element, pointers[static_cast<size_t>(m)], index);
  // One byte offset, so that no pass splits a pointer per row out of it (and hoists them).
  const int64_t elementBytes = element->getPrimitiveSizeInBits() / 8;
  llvm::Value* bytes = e.b.CreateAdd(e.b.CreateMul(index, e.constant(elementBytes)),
                                     e.constant(m * stride * static_cast<int64_t>(sizeof(float))));
  return e.b.CreateGEP(e.b.getInt8Ty(), pointers[0], bytes);
}

llvm::Value* EmitContext::TileRows::start(int64_t m) const {
  return stride ? e.b.CreateConstGEP1_64(e.f32, pointers[0], m * stride)
                : pointers[static_cast<size_t>(m)];
}

} // namespace rnnc::codegen

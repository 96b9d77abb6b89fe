#include "codegen/EmitContext.h"

#include "ir/Error.h"

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
  layerNormFn = module->getOrInsertFunction(
      kLayerNormSymbol, llvm::FunctionType::get(none, {i64, i64, ptr, i64, ptr, i64, f32}, false));
  layerNormGradFn = module->getOrInsertFunction(
      kLayerNormGradSymbol,
      llvm::FunctionType::get(none, {i64, i64, ptr, i64, ptr, i64, ptr, i64, f32}, false));
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

} // namespace rnnc::codegen

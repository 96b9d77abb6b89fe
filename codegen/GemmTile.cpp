#include "codegen/GemmTile.h"

#include "codegen/LLVMIRHeaders.h"
#include "ir/Error.h"

#include <llvm/IR/IntrinsicsX86.h>

#include <vector>

namespace rnnc::codegen {

std::unique_ptr<llvm::Module> emitGemmTile(llvm::LLVMContext& context, const Target& target,
                                           GemmOperands operands) {
  const bool pairs = operands == GemmOperands::Bf16Pairs;
  const char* name = pairs ? kGemmPairTileFunctionName : kGemmTileFunctionName;
  auto module = std::make_unique<llvm::Module>(name, context);
  module->setTargetTriple(target.triple);
  llvm::IRBuilder<> b(context);
  const GemmTileShape shape = gemmTileShape(target);
  const int64_t width = target.vectorWidth, vectors = shape.columns / width;
  RNNC_INTERNAL_CHECK(!pairs || width == 16, "vdpbf16ps's pairs on zmm");
  llvm::Type* f32 = b.getFloatTy();
  llvm::Type* i64 = b.getInt64Ty();
  llvm::Type* ptr = b.getPtrTy();
  // A's and B's elements: floats, or 32-bit words of two bf16 values.
  llvm::Type* element = pairs ? b.getInt32Ty() : f32;
  auto* vector = llvm::FixedVectorType::get(f32, static_cast<unsigned>(width));
  auto* elements = llvm::FixedVectorType::get(element, static_cast<unsigned>(width));
  llvm::Function* dot = pairs ? llvm::Intrinsic::getDeclaration(
                                    module.get(), llvm::Intrinsic::x86_avx512bf16_dpbf16ps_512)
                              : nullptr;
  auto* type = llvm::FunctionType::get(b.getVoidTy(), {i64, ptr, ptr, ptr, i64}, false);
  auto* fn = llvm::Function::Create(type, llvm::Function::ExternalLinkage, name, module.get());
  fn->addFnAttr("target-cpu", target.cpu);
  fn->addFnAttr("target-features", target.features);
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  llvm::Value* depth = fn->getArg(0);
  llvm::Value* a = fn->getArg(1);
  llvm::Value* bPanel = fn->getArg(2);
  llvm::Value* c = fn->getArg(3);
  llvm::Value* ldc = fn->getArg(4);
  for (unsigned i : {1u, 2u, 3u})
    fn->addParamAttr(i, llvm::Attribute::NoAlias);

  auto* entry = llvm::BasicBlock::Create(context, "entry", fn);
  auto* loop = llvm::BasicBlock::Create(context, "depth", fn);
  auto* done = llvm::BasicBlock::Create(context, "done", fn);
  b.SetInsertPoint(entry);
  llvm::Value* zero = llvm::ConstantAggregateZero::get(vector);
  // The tile of C is read and written once, after the depth loop, from wherever it is (a
  // weight gradient of megabytes is not in L2): ask for its lines now, for writing, so that
  // they arrive during the loop rather than stall its end.
  for (int64_t i = 0; i < shape.rows; ++i) {
    llvm::Value* cRow = b.CreateGEP(f32, c, b.CreateMul(b.getInt64(i), ldc));
    for (int64_t v = 0; v < vectors; v += std::max<int64_t>(1, 16 / width))
      b.CreateIntrinsic(llvm::Intrinsic::prefetch, {ptr},
                        {b.CreateConstGEP1_64(f32, cRow, v * width), b.getInt32(1), b.getInt32(3),
                         b.getInt32(1)});
    // The row's last float: its line too where the row is not on one line.
    b.CreateIntrinsic(llvm::Intrinsic::prefetch, {ptr},
                      {b.CreateConstGEP1_64(f32, cRow, shape.columns - 1), b.getInt32(1),
                       b.getInt32(3), b.getInt32(1)});
  }
  b.CreateCondBr(b.CreateICmpSGT(depth, b.getInt64(0)), loop, done);

  // The depth loop: the accumulators live in registers as phis.
  b.SetInsertPoint(loop);
  llvm::PHINode* k = b.CreatePHI(i64, 2, "k");
  k->addIncoming(b.getInt64(0), entry);
  std::vector<llvm::PHINode*> sums;
  for (int64_t n = 0; n < shape.rows * vectors; ++n) {
    sums.push_back(b.CreatePHI(vector, 2, "sum"));
    sums.back()->addIncoming(zero, entry);
  }
  // vdpbf16ps takes its pairs as vectors of bf16: the words reinterpreted.
  auto asPairs = [&](llvm::Value* words, unsigned operand) {
    return b.CreateBitCast(words, dot->getFunctionType()->getParamType(operand));
  };
  llvm::Value* bRow = b.CreateGEP(element, bPanel, b.CreateMul(k, b.getInt64(shape.columns)));
  std::vector<llvm::Value*> bVectors;
  for (int64_t v = 0; v < vectors; ++v) {
    llvm::Value* loaded = b.CreateAlignedLoad(
        elements, b.CreateConstGEP1_64(element, bRow, v * width), llvm::Align(4));
    bVectors.push_back(pairs ? asPairs(loaded, 2) : loaded);
  }
  llvm::Value* aRow = b.CreateGEP(element, a, b.CreateMul(k, b.getInt64(shape.rows)));
  std::vector<llvm::Value*> next(sums.size());
  for (int64_t i = 0; i < shape.rows; ++i) {
    llvm::Value* scalar =
        b.CreateAlignedLoad(element, b.CreateConstGEP1_64(element, aRow, i), llvm::Align(4));
    llvm::Value* broadcast = b.CreateVectorSplat(static_cast<unsigned>(width), scalar);
    if (pairs)
      broadcast = asPairs(broadcast, 1);
    for (int64_t v = 0; v < vectors; ++v) {
      const size_t n = static_cast<size_t>(i * vectors + v);
      next[n] = pairs ? b.CreateCall(dot, {sums[n], broadcast, bVectors[v]})
                      : b.CreateIntrinsic(llvm::Intrinsic::fma, {vector},
                                          {broadcast, bVectors[v], sums[n]});
    }
  }
  llvm::Value* k1 = b.CreateAdd(k, b.getInt64(1));
  k->addIncoming(k1, loop);
  for (size_t n = 0; n < sums.size(); ++n)
    sums[n]->addIncoming(next[n], loop);
  b.CreateCondBr(b.CreateICmpSLT(k1, depth), loop, done);

  // c += the sums (zero when the depth is).
  b.SetInsertPoint(done);
  std::vector<llvm::PHINode*> totals;
  for (size_t n = 0; n < sums.size(); ++n) {
    totals.push_back(b.CreatePHI(vector, 2, "total"));
    totals.back()->addIncoming(zero, entry);
    totals.back()->addIncoming(next[n], loop);
  }
  for (int64_t i = 0; i < shape.rows; ++i) {
    llvm::Value* cRow = b.CreateGEP(f32, c, b.CreateMul(b.getInt64(i), ldc));
    for (int64_t v = 0; v < vectors; ++v) {
      llvm::Value* at = b.CreateConstGEP1_64(f32, cRow, v * width);
      llvm::Value* old = b.CreateAlignedLoad(vector, at, llvm::Align(4));
      b.CreateAlignedStore(b.CreateFAdd(old, totals[static_cast<size_t>(i * vectors + v)]), at,
                           llvm::Align(4));
    }
  }
  b.CreateRetVoid();
  return module;
}

} // namespace rnnc::codegen

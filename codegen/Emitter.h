// The code generator's state while it lowers one cell (see codegen/CellEmitter.h): shared by
// the files that emit its parts. CellEmitter.cpp: arguments, phases, threads, steps and
// instructions; KernelEmitter.cpp: fused elementwise kernels and layer norms;
// ProductKernelEmitter.cpp: matrix products tiled inside their kernel. Internal to codegen/.
#pragma once

#include "codegen/LLVMHeaders.h"
#include "codegen/RunArgs.h"
#include "codegen/StoragePlan.h"
#include "codegen/Target.h"
#include "codegen/VectorMath.h"
#include "ir/Cell.h"

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace rnnc::codegen {

using ir::Op;

// Where a memory-resident value is: element [r, c] is at base + r * rowStride + c. A zero row
// stride broadcasts one row (a bias vector read in a [B, F] kernel).
struct View {
  llvm::Value* base = nullptr;
  llvm::Value* rowStride = nullptr;
};

class Emitter {
public:
  Emitter(llvm::LLVMContext& context, const ir::Cell& cell, const StoragePlan& plan,
          const Target& target, const std::string& name)
      : context_(context), cell_(cell), plan_(plan), target_(target),
        module_(std::make_unique<llvm::Module>("rnnc_" + cell.name, context)), b_(context) {
    module_->setTargetTriple(target.triple);
    f32_ = llvm::Type::getFloatTy(context);
    i64_ = llvm::Type::getInt64Ty(context);
    ptr_ = llvm::PointerType::get(context, 0);
    auto* fnType = llvm::FunctionType::get(llvm::Type::getVoidTy(context), {ptr_}, false);
    fn_ = llvm::Function::Create(fnType, llvm::Function::ExternalLinkage, name, *module_);
    fn_->addFnAttr("target-cpu", target.cpu);
    fn_->addFnAttr("target-features", target.features);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    gemm_ = module_->getOrInsertFunction(
        kGemmSymbol, llvm::FunctionType::get(
                         llvm::Type::getVoidTy(context),
                         {i64_, i64_, i64_, i64_, ptr_, i64_, ptr_, i64_, ptr_, i64_}, false));
    barrier_ = module_->getOrInsertFunction(
        kBarrierSymbol, llvm::FunctionType::get(llvm::Type::getVoidTy(context), {ptr_}, false));
    layerNorm_ = module_->getOrInsertFunction(
        kLayerNormSymbol,
        llvm::FunctionType::get(llvm::Type::getVoidTy(context),
                                {i64_, i64_, ptr_, i64_, ptr_, i64_, f32_}, false));
  }

  std::unique_ptr<llvm::Module> emit();

private:
  // ---- Arguments and addressing ---------------------------------------------------------------

  llvm::Value* constant(int64_t v) {
    return llvm::ConstantInt::get(i64_, static_cast<uint64_t>(v));
  }

  size_t index(const BufferSpec& spec) const {
    return static_cast<size_t>(&spec - plan_.buffers.data());
  }

  std::vector<llvm::Value*> loadPointerArray(llvm::Value* array, size_t count, const char* name);

  void loadArguments();

  // Views valid everywhere: parameters and fixed-size buffers.
  void resetViews();

  View view(const ir::Value* value);

  llvm::Value* elementPointer(const View& v, llvm::Value* row, llvm::Value* col) {
    llvm::Value* offset = b_.CreateAdd(b_.CreateMul(row, v.rowStride), col);
    return b_.CreateGEP(f32_, v.base, offset);
  }

  // ---- Control flow -----------------------------------------------------------------------

  // The start of a loop whose test and latch the caller writes (forLoop's fixed stride and
  // single counter do not fit it): a header block, entered from here, with the insert point in
  // it and a counter phi starting at `begin`; and the exit block, empty.
  struct OpenLoop {
    llvm::PHINode* counter;
    llvm::BasicBlock* header;
    llvm::BasicBlock* exit;
  };
  OpenLoop openLoop(llvm::Value* begin, const std::string& name) {
    llvm::BasicBlock* before = b_.GetInsertBlock();
    auto* header = llvm::BasicBlock::Create(context_, name, fn_);
    auto* exit = llvm::BasicBlock::Create(context_, name + ".exit", fn_);
    b_.CreateBr(header);
    b_.SetInsertPoint(header);
    llvm::PHINode* counter = b_.CreatePHI(i64_, 2, name + ".i");
    counter->addIncoming(begin, before);
    return {counter, header, exit};
  }

  template <class Body>
  void forLoop(llvm::Value* begin, llvm::Value* end, llvm::Value* stride, const std::string& name,
               Body&& body) {
    llvm::BasicBlock* before = b_.GetInsertBlock();
    auto* header = llvm::BasicBlock::Create(context_, name + ".header", fn_);
    auto* loop = llvm::BasicBlock::Create(context_, name + ".body", fn_);
    auto* exit = llvm::BasicBlock::Create(context_, name + ".exit", fn_);
    b_.CreateBr(header);
    b_.SetInsertPoint(header);
    llvm::PHINode* i = b_.CreatePHI(i64_, 2, name);
    i->addIncoming(begin, before);
    b_.CreateCondBr(b_.CreateICmpSLT(i, end), loop, exit);
    b_.SetInsertPoint(loop);
    body(i);
    llvm::Value* next = b_.CreateAdd(i, stride, name + ".next");
    i->addIncoming(next, b_.GetInsertBlock());
    llvm::BranchInst* latch = b_.CreateBr(header);
    // Our loops are unrolled where it pays already (the depth loop of product tiles) or are
    // meant to stay loops (a tile's rows share one copy of the elementwise code); LLVM
    // unrolling them again multiplies compile time for nothing.
    llvm::MDNode* disable =
        llvm::MDNode::get(context_, llvm::MDString::get(context_, "llvm.loop.unroll.disable"));
    llvm::MDNode* loopId = llvm::MDNode::getDistinct(context_, {nullptr, disable});
    loopId->replaceOperandWith(0, loopId);
    latch->setMetadata(llvm::LLVMContext::MD_loop, loopId);
    b_.SetInsertPoint(exit);
  }

  template <class Body> void ifThen(llvm::Value* condition, const std::string& name, Body&& body) {
    auto* run = llvm::BasicBlock::Create(context_, name, fn_);
    auto* after = llvm::BasicBlock::Create(context_, name + ".done", fn_);
    b_.CreateCondBr(condition, run, after);
    b_.SetInsertPoint(run);
    body();
    b_.CreateBr(after);
    b_.SetInsertPoint(after);
  }

  // Emits `body` to run only when the call asks for `phase`.
  template <class Body> void ifPhase(RnncPhase phase, const std::string& name, Body&& body) {
    llvm::Value* wanted = b_.CreateAnd(phases_, constant(phase));
    ifThen(b_.CreateICmpNE(wanted, constant(0)), name, body);
  }

  // ---- Threads ------------------------------------------------------------------------------
  // Every thread runs the same code on its share of the work: rows of batched values, blocks
  // of columns of fused products (each thread keeps the same weights for the whole sequence),
  // everything without a batch dimension on thread 0. Barriers separate work split one way
  // from work that reads it split another way.

  struct RowRange {
    llvm::Value* begin;
    llvm::Value* end;
  };

  // This thread's part of [0, total): contiguous, sizes differing by at most one.
  RowRange share(llvm::Value* total) {
    auto bound = [&](llvm::Value* thread) {
      return b_.CreateSDiv(b_.CreateMul(total, thread), threads_);
    };
    return {bound(thread_), bound(b_.CreateAdd(thread_, constant(1)))};
  }

  RowRange firstThreadOnly(llvm::Value* total) {
    return {constant(0),
            b_.CreateSelect(b_.CreateICmpEQ(thread_, constant(0)), total, constant(0))};
  }

  // The rows of `value` this thread computes.
  RowRange rowsFor(const ir::Value* value, llvm::Value* batchRows) {
    return value->isBatched() ? share(batchRows) : firstThreadOnly(constant(fixedRowsOf(value)));
  }

  void barrier();

  void copyRows(const View& to, const View& from, RowRange rows, int64_t cols);

  // ---- One time step ------------------------------------------------------------------------

  void emitStep(llvm::Value* t);

  // ---- Blocks and instructions --------------------------------------------------------------

  // Which of a block's work to emit: the pre block's is split between the parameter phase
  // (no batch dimension) and the pre phase (per row).
  enum class Work { All, PerRow, WithoutBatch };

  // Work split by rows may follow work split by the same rows without a barrier; a fused
  // product (split by columns, reading its input's rows whole) and work done on thread 0 alone
  // are fenced on both sides.
  void emitBlock(const ir::Block& block, llvm::Value* batchRows, Work which = Work::All);

  void emitInstruction(const ir::Instr& instr, llvm::Value* batchRows);

  // ---- Fused kernels ------------------------------------------------------------------------

  // One loop nest over the kernel's iteration space [R, F]: rows outside, columns inside in
  // groups of interleaved vectors, then single vectors, then one column at a time.
  void emitKernel(const ir::Block& block, const KernelGroup& group, llvm::Value* batchRows);

  // ---- Matrix products in register tiles ------------------------------------------------

  // Packs a fused product's weights in tile order (StoragePlan.h, PackedProduct): per block of
  // columns, per depth k, each slice's `width` weights side by side; zero past the columns.
  void emitPacking(const PackedProduct& packed);

  // A product computed in tiles (StoragePlan.h, PackedProduct), led by its kernel `group` or,
  // with no group, standalone: per chunk of rows, per block of `width` columns, per tile of
  // rows, the product's columns of every slice are computed in registers, then the kernel's
  // elementwise work runs on them (standalone: they are stored).
  void emitProductKernel(const ir::Block& block, const KernelGroup* group,
                         const PackedProduct& packed, llvm::Value* batchRows);

  using Tile = std::vector<std::vector<llvm::Value*>>; // per row, one vector per slice

  // Rows [firstRow, firstRow + rows) of x times block `blk` of the packed weights. The slices
  // are accumulated in passes of as many as the tile's accumulators allow for this many rows
  // (a panel for a full tile, all of them for one row); each pass is one walk over the depth.
  void prefetchRows(const std::vector<const ir::Value*>& operands, llvm::Value* firstRow,
                    llvm::Value* lastRow, llvm::Value* column, int64_t rows);
  Tile emitTile(const View& x, llvm::Value* weights, const PackedProduct& packed, llvm::Value* blk,
                llvm::Value* firstRow, int64_t rows);

  static bool isImmediate(const ir::Value* v) {
    return !v->isArgument() && v->def->op == Op::Const;
  }

  // A layer norm fused into a kernel: its values are computed where they are read.
  static bool isNormalised(const ir::Value* v) {
    return !v->isArgument() && v->def->op == Op::LayerNorm && v->def->kernel >= 0;
  }

  // Sum over columns [0, n) of row r of `x`, each element mapped by `f`: vector lanes, then the
  // rest one at a time, accumulated in stack slots that LLVM promotes to registers.
  template <class F> llvm::Value* rowSum(const View& x, llvm::Value* r, int64_t n, F&& f);

  struct RowStatistics {
    llvm::Value* mean = nullptr;
    llvm::Value* inverseStd = nullptr;
  };

  // Mean and 1/sqrt(var + eps) of row r, in two passes (one pass of sum and sum of squares
  // cancels badly when the mean is large; PyTorch is careful here too).
  RowStatistics emitRowStatistics(const ir::Instr& norm, llvm::Value* r);

  // The normalised values of `norm` (a fused layer norm) at columns offset + j onwards.
  llvm::Value* normalised(const ir::Value* norm, llvm::Value* r, llvm::Value* j, int64_t offset,
                          int64_t width);

  static bool definedIn(const ir::Block& block, const KernelGroup& group, const ir::Value* v) {
    for (size_t i = group.first; i < group.last; ++i)
      if (&block[i]->result == v)
        return true;
    return false;
  }

  // `values`: what is already in registers (the slices of a fused product's tile).
  void emitKernelBody(const ir::Block& block, const KernelGroup& group, llvm::Value* r,
                      llvm::Value* j, int64_t width,
                      std::unordered_map<const ir::Value*, llvm::Value*> values = {});

  template <class Get> llvm::Value* compute(const ir::Instr& instr, Get& get, llvm::Type* vec);

  llvm::LLVMContext& context_;
  const ir::Cell& cell_;
  const StoragePlan& plan_;
  const Target& target_;
  std::unique_ptr<llvm::Module> module_;
  Builder b_;
  llvm::Function* fn_ = nullptr;
  llvm::Type* f32_ = nullptr;
  llvm::Type* i64_ = nullptr;
  llvm::PointerType* ptr_ = nullptr;
  llvm::FunctionCallee gemm_, layerNorm_, barrier_;
  llvm::Value* steps_ = nullptr;
  llvm::Value* step_ = nullptr; // the step being emitted; null outside the time loop
  llvm::Value* phases_ = nullptr;
  llvm::Value* thread_ = nullptr;  // this thread's index in [0, threads)
  llvm::Value* threads_ = nullptr; // how many threads run this call together
  llvm::Value* team_ = nullptr;    // what rnnc_barrier synchronises
  // No work emitted since the last barrier on this path: another barrier would be a no-op.
  bool synced_ = true;
  llvm::Value* batch_ = nullptr;
  llvm::Value* output_ = nullptr;
  std::vector<llvm::Value*> params_, inputs_, states_, buffers_;
  std::unordered_map<const ir::Value*, View> views_;
  std::unordered_map<const ir::Value*, RowStatistics> rowStatistics_; // of the current row
};

} // namespace rnnc::codegen

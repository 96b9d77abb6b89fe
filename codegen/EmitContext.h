// What the parts of the code generator share while they lower one cell (codegen/CellEmitter.h):
// the module and function being built, the IR builder, the run's arguments as loaded on entry,
// where each value lives (views), and the helpers for addresses, loops and threads. The parts:
// CellEmitter (arguments, phases, steps, blocks, instructions), KernelEmitter (fused
// elementwise kernels and layer norms) and ProductKernelEmitter (matrix products in register
// tiles). Internal to codegen/.
#pragma once

#include "codegen/LLVMIRHeaders.h"
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

// Where a memory-resident value is: element [r, c] is at base + r * rowStride + c. A zero row
// stride broadcasts one row (a bias vector read in a [B, F] kernel).
struct View {
  llvm::Value* base = nullptr;
  llvm::Value* rowStride = nullptr;
};

// Rows [begin, end), as run-time values.
struct RowRange {
  llvm::Value* begin;
  llvm::Value* end;
};

class EmitContext {
public:
  EmitContext(llvm::LLVMContext& llvmContext, const ir::Cell& cell, const StoragePlan& plan,
              const Target& target, const std::string& name);

  // Loads the run's arguments from `args` (a `const RnncRunArgs*`) into the members below,
  // each read at its offset in the C struct (RunArgs.h): one layout, the struct's.
  void loadArguments(llvm::Value* args);

  // The views of each part of a run (they replace all others): parameters and fixed buffers,
  // valid everywhere; with them the whole sequences of the pre block ([T*B, F]: inputs and
  // pre buffers); or with them step t's rows of inputs, pre buffers and the output, the states
  // (from step 1 on, a state the output carries over is read from the output's rows of step
  // t - 1) and the step buffers. stepViews returns the view of step t's output rows.
  void paramViews();
  void sequenceViews();
  View stepViews(llvm::Value* t);

  // ---- Addressing -----------------------------------------------------------------------------

  llvm::Value* constant(int64_t v) { return llvm::ConstantInt::get(i64, static_cast<uint64_t>(v)); }

  size_t index(const BufferSpec& spec) const {
    return static_cast<size_t>(&spec - plan.buffers.data());
  }

  // Where `value` is: its entry in `views`, or (a slice) an offset into what it slices.
  View view(const ir::Value* value);

  llvm::Value* elementPointer(const View& v, llvm::Value* row, llvm::Value* col) {
    llvm::Value* offset = b.CreateAdd(b.CreateMul(row, v.rowStride), col);
    return b.CreateGEP(f32, v.base, offset);
  }

  // Rows [firstRow, firstRow + rows) of `v`, as a register tile's depth loop reads them. Rows a
  // constant stride apart are addressed from one base, row m's distance an addressing mode's
  // displacement (`vbroadcastss disp(%base,%k,4)`): a 14-row tile keeps one general register
  // for its inputs. With a pointer per row the registers ran out, 9 of 14 were reloaded from
  // the stack at every depth step, and the register allocator's live-range splitting was a
  // fifth of the back end's time.
  class TileRows {
  public:
    TileRows(EmitContext& e, const View& v, llvm::Value* firstRow, int64_t rows);
    // Row m's element `index` when the row is read as elements of `element` (a scalar type).
    llvm::Value* at(int64_t m, llvm::Type* element, llvm::Value* index) const;
    // Row m's first float.
    llvm::Value* start(int64_t m) const;

  private:
    EmitContext& e;
    int64_t stride = 0;                 // floats between rows when constant, else 0
    std::vector<llvm::Value*> pointers; // the first row's start, or every row's
  };

  // ---- Control flow -----------------------------------------------------------------------

  // The start of a loop whose test and latch the caller writes (forLoop's fixed stride and
  // single counter do not fit it): a header block, entered from here, with the insert point in
  // it and a counter phi starting at `begin`; and the exit block, empty.
  struct OpenLoop {
    llvm::PHINode* counter;
    llvm::BasicBlock* header;
    llvm::BasicBlock* exit;
  };
  OpenLoop openLoop(llvm::Value* begin, const std::string& name);

  template <class Body>
  void forLoop(llvm::Value* begin, llvm::Value* end, llvm::Value* stride, const std::string& name,
               Body&& body) {
    llvm::BasicBlock* before = b.GetInsertBlock();
    auto* header = llvm::BasicBlock::Create(llvmContext, name + ".header", fn);
    auto* loop = llvm::BasicBlock::Create(llvmContext, name + ".body", fn);
    auto* exit = llvm::BasicBlock::Create(llvmContext, name + ".exit", fn);
    b.CreateBr(header);
    b.SetInsertPoint(header);
    llvm::PHINode* i = b.CreatePHI(i64, 2, name);
    i->addIncoming(begin, before);
    b.CreateCondBr(b.CreateICmpSLT(i, end), loop, exit);
    b.SetInsertPoint(loop);
    body(i);
    llvm::Value* next = b.CreateAdd(i, stride, name + ".next");
    i->addIncoming(next, b.GetInsertBlock());
    disableUnrolling(b.CreateBr(header));
    b.SetInsertPoint(exit);
  }

  template <class Body> void ifThen(llvm::Value* condition, const std::string& name, Body&& body) {
    auto* run = llvm::BasicBlock::Create(llvmContext, name, fn);
    auto* after = llvm::BasicBlock::Create(llvmContext, name + ".done", fn);
    b.CreateCondBr(condition, run, after);
    b.SetInsertPoint(run);
    body();
    b.CreateBr(after);
    b.SetInsertPoint(after);
  }

  // Emits `body` to run only when the call asks for `phase`.
  template <class Body> void ifPhase(RnncPhase phase, const std::string& name, Body&& body) {
    llvm::Value* wanted = b.CreateAnd(phases, constant(phase));
    ifThen(b.CreateICmpNE(wanted, constant(0)), name, body);
  }

  // ---- Threads ------------------------------------------------------------------------------
  // Every thread runs the same code on its share of the work: rows of batched values, blocks
  // of columns of fused products (each thread keeps the same weights for the whole sequence),
  // everything without a batch dimension on thread 0. Barriers separate work split one way
  // from work that reads it split another way.

  // This thread's part of [0, total): contiguous, sizes differing by at most one.
  RowRange share(llvm::Value* total) {
    auto bound = [&](llvm::Value* t) { return b.CreateSDiv(b.CreateMul(total, t), threads); };
    return {bound(thread), bound(b.CreateAdd(thread, constant(1)))};
  }

  // This thread's part of [0, total) blocks of work that may move between threads from one
  // barrier to the next: contiguous, sized by each thread's measured speed (RunArgs.h,
  // rnnc_share_start). For work whose split nothing else depends on: the recurrent products'
  // column blocks, each step's work complete at the next barrier.
  RowRange balancedShare(llvm::Value* total) {
    return {b.CreateCall(shareStartFn, {team, thread, total}),
            b.CreateCall(shareStartFn, {team, b.CreateAdd(thread, constant(1)), total})};
  }
  // Times this thread's work on its balanced share (emitted around it): its speed.
  void shareClock(bool stop) { b.CreateCall(shareClockFn, {team, thread, constant(stop ? 1 : 0)}); }

  RowRange firstThreadOnly(llvm::Value* total) {
    return {constant(0), b.CreateSelect(b.CreateICmpEQ(thread, constant(0)), total, constant(0))};
  }

  // The rows of `value` this thread computes.
  RowRange rowsFor(const ir::Value* value, llvm::Value* batchRows) {
    return value->isBatched() ? share(batchRows) : firstThreadOnly(constant(fixedRowsOf(value)));
  }

  // Waits for every thread, unless no work was emitted since the last barrier on this path.
  void barrier();

  void copyRows(const View& to, const View& from, RowRange rows, int64_t cols);

  // ---- State --------------------------------------------------------------------------------

  llvm::LLVMContext& llvmContext;
  const ir::Cell& cell;
  const StoragePlan& plan;
  const Target& target;
  std::unique_ptr<llvm::Module> module;
  Builder b;
  llvm::Function* fn = nullptr;
  llvm::Type* f32 = nullptr;
  llvm::Type* i64 = nullptr;
  llvm::PointerType* ptr = nullptr;
  // The runtime's helpers (RunArgs.h).
  llvm::FunctionCallee gemmFn, layerNormFn, layerNormGradFn, barrierFn, shareStartFn, shareClockFn,
      packWeightsFn, dropoutMaskFn, tileSplitFn, tileUnitStartFn;
  // The run's arguments, loaded on entry.
  llvm::Value* steps = nullptr;
  llvm::Value* batch = nullptr;
  llvm::Value* phases = nullptr;
  llvm::Value* thread = nullptr;  // this thread's index in [0, threads)
  llvm::Value* threads = nullptr; // how many threads run this call together
  llvm::Value* team = nullptr;    // what rnnc_barrier synchronises
  llvm::Value* output = nullptr;
  std::vector<llvm::Value*> params, inputs, states, buffers;
  std::vector<llvm::Value*> inputStrides; // floats per row of each input (RnncRunArgs)
  llvm::Value* reverse = nullptr;         // i1, RnncRunArgs::reverse; null where it cannot be set
  // RnncRunArgs::maskSeed and maskRow, loaded where the cell draws dropout masks (else null).
  llvm::Value* maskSeed = nullptr;
  llvm::Value* maskRow = nullptr;
  // Inputs as dense rows (a GPU's, and its host emulation's): RnncRunArgs::inputStrides unread.
  bool denseInputs = false;
  llvm::Value* step = nullptr; // the step being emitted; null outside the time loop
  // No work emitted since the last barrier on this path: another barrier would be a no-op.
  bool synced = true;
  // Where the walks over the depth of full-height tiles go (ProductKernelEmitter::emitTile):
  // inline, or into functions named by their shape (`walk.*`) that this module defines (the
  // setup part: its own products' and, from an emission of the loop that is then dropped, the
  // time loop's) or only declares (the loop part). One walk then serves the input projection
  // and the recurrent product alike, compiled once, beside the loop.
  enum class TileWalks { Inline, Defined, Declared };
  TileWalks tileWalks = TileWalks::Inline;
  std::unordered_map<const ir::Value*, View> views;

private:
  std::vector<llvm::Value*> loadPointerArray(llvm::Value* array, size_t count, const char* name);

  // Our loops are unrolled where it pays already (the depth loop of product tiles) or are meant
  // to stay loops (a tile's rows share one copy of the elementwise code); LLVM unrolling them
  // again multiplies compile time for nothing.
  void disableUnrolling(llvm::BranchInst* latch);
};

} // namespace rnnc::codegen

#include "codegen/CellEmitter.h"

#include "codegen/LLVMHeaders.h"
#include "codegen/RunArgs.h"
#include "codegen/VectorMath.h"
#include "ir/Error.h"

#include "ir/ShapeInference.h"
#include <algorithm>

#include <unordered_map>
#include <unordered_set>

namespace rnnc::codegen {
namespace {

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

  std::unique_ptr<llvm::Module> emit() {
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
      forLoop(constant(0), steps_, constant(1), "step", [&](llvm::Value* t) {
        synced_ = false; // the previous step's state copies
        emitStep(t);
      });
    });
    b_.CreateRetVoid();
    return std::move(module_);
  }

private:
  // ---- Arguments and addressing ---------------------------------------------------------------

  llvm::Value* constant(int64_t v) {
    return llvm::ConstantInt::get(i64_, static_cast<uint64_t>(v));
  }

  size_t index(const BufferSpec& spec) const {
    return static_cast<size_t>(&spec - plan_.buffers.data());
  }

  std::vector<llvm::Value*> loadPointerArray(llvm::Value* array, size_t count, const char* name) {
    std::vector<llvm::Value*> pointers;
    for (size_t i = 0; i < count; ++i) {
      llvm::Value* slot = b_.CreateConstGEP1_64(ptr_, array, i);
      pointers.push_back(b_.CreateLoad(ptr_, slot, std::string(name) + std::to_string(i)));
    }
    return pointers;
  }

  void loadArguments() {
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
  void resetViews() {
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

  View view(const ir::Value* value) {
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

  llvm::Value* elementPointer(const View& v, llvm::Value* row, llvm::Value* col) {
    llvm::Value* offset = b_.CreateAdd(b_.CreateMul(row, v.rowStride), col);
    return b_.CreateGEP(f32_, v.base, offset);
  }

  // ---- Control flow -----------------------------------------------------------------------

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
    return isBatchedValue(value) ? share(batchRows) : firstThreadOnly(constant(fixedRowsOf(value)));
  }

  static bool isBatchedValue(const ir::Value* value) {
    return !value->shape.empty() && value->shape[0].mentions(ir::kBatchSymbol);
  }

  void barrier() {
    if (synced_)
      return;
    ifThen(b_.CreateICmpSGT(threads_, constant(1)), "barrier",
           [&] { b_.CreateCall(barrier_, {team_}); });
    synced_ = true;
  }

  void copyRows(const View& to, const View& from, RowRange rows, int64_t cols) {
    synced_ = false;
    forLoop(rows.begin, rows.end, constant(1), "copy", [&](llvm::Value* r) {
      b_.CreateMemCpy(elementPointer(to, r, constant(0)), llvm::Align(4),
                      elementPointer(from, r, constant(0)), llvm::Align(4),
                      constant(cols * static_cast<int64_t>(sizeof(float))));
    });
  }

  // ---- One time step ------------------------------------------------------------------------

  void emitStep(llvm::Value* t) {
    resetViews();
    llvm::Value* firstRow = b_.CreateMul(t, batch_, "first_row");
    auto rowsFrom = [&](llvm::Value* base, int64_t cols) {
      return View{b_.CreateGEP(f32_, base, b_.CreateMul(firstRow, constant(cols))), constant(cols)};
    };
    for (size_t i = 0; i < cell_.inputs.size(); ++i)
      views_[cell_.inputs[i].get()] = rowsFrom(inputs_[i], columnsOf(cell_.inputs[i].get()));
    for (size_t i = 0; i < cell_.states.size(); ++i)
      views_[cell_.states[i].get()] = {states_[i], constant(columnsOf(cell_.states[i].get()))};
    for (const BufferSpec& spec : plan_.buffers)
      if (spec.rows == Rows::Sequence)
        views_[spec.value] = rowsFrom(buffers_[index(spec)], spec.cols);
      else if (spec.rows == Rows::Step && !views_.count(spec.value))
        views_[spec.value] = {buffers_[index(spec)], constant(spec.cols)};
    const int64_t outCols = columnsOf(cell_.output);
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
      if (cell_.updates[i].next != cell_.updates[i].state && !plan_.updatedInKernel[i])
        copyRows(views_.at(cell_.states[i].get()), sources[i], mine,
                 columnsOf(cell_.states[i].get()));
  }

  // ---- Blocks and instructions --------------------------------------------------------------

  // Work split by rows may follow work split by the same rows without a barrier; a fused
  // product (split by columns, reading its input's rows whole) and work done on thread 0 alone
  // are fenced on both sides.
  enum class Work { All, PerRow, WithoutBatch };

  void emitBlock(const ir::Block& block, llvm::Value* batchRows, Work which = Work::All) {
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
      bool product = plan_.packedProductOf(block[i].get()) != nullptr;
      bool unbatched = true; // every value the work writes is without a batch dimension
      for (size_t j = i; j < end; ++j)
        if (block[j]->op != Op::Const && block[j]->op != Op::Slice)
          unbatched &= !isBatchedValue(&block[j]->result);
      unbatched &= !product;
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
      else
        emitInstruction(*block[i], batchRows);
      if (product || unbatched)
        barrier();
      i = end;
    }
  }

  void emitInstruction(const ir::Instr& instr, llvm::Value* batchRows) {
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

  // ---- Fused kernels ------------------------------------------------------------------------

  // One loop nest over the kernel's iteration space [R, F]: rows outside, columns inside in
  // vectors of the target's width, then the remaining columns one at a time.
  void emitKernel(const ir::Block& block, const KernelGroup& group, llvm::Value* batchRows) {
    if (const PackedProduct* packed = plan_.packedProductOf(block[group.first].get()))
      return emitProductKernel(block, group, *packed, batchRows);
    ir::Shape space;
    for (size_t i = group.first; i < group.last; ++i) {
      if (block[i]->op == Op::LayerNorm)
        continue; // normalised on the fly: it does not set the iteration space
      auto widened = ir::broadcastShapes(space, block[i]->result.shape);
      RNNC_INTERNAL_CHECK(widened.has_value(), "kernel members do not share an iteration space");
      space = *widened;
    }
    bool batched = !space.empty() && space[0].mentions(ir::kBatchSymbol);
    int64_t rowsFixed = 1;
    for (size_t d = 0; d + 1 < space.size(); ++d)
      if (!batched)
        rowsFixed *= space[d].constantValue();
    RowRange rows = batched ? share(batchRows) : firstThreadOnly(constant(rowsFixed));
    const int64_t cols = space.empty() ? 1 : space.back().constantValue();
    const int64_t width = target_.vectorWidth;
    const int64_t vectorCols = cols - cols % width;

    // Views are computed before the loops so that their address arithmetic is not repeated.
    for (size_t i = group.first; i < group.last; ++i) {
      for (const ir::Value* operand : block[i]->operands)
        if (!definedIn(block, group, operand) && !isImmediate(operand))
          view(operand);
      if (block[i]->op == Op::Slice && !isNormalised(block[i]->operands[0]))
        view(&block[i]->result);
    }
    forLoop(rows.begin, rows.end, constant(1), "row", [&](llvm::Value* r) {
      for (size_t i = group.first; i < group.last; ++i)
        if (block[i]->op == Op::LayerNorm)
          rowStatistics_[&block[i]->result] = emitRowStatistics(*block[i], r);
      if (vectorCols > 0)
        forLoop(constant(0), constant(vectorCols), constant(width), "col",
                [&](llvm::Value* j) { emitKernelBody(block, group, r, j, width); });
      if (vectorCols < cols)
        forLoop(constant(vectorCols), constant(cols), constant(1), "tail",
                [&](llvm::Value* j) { emitKernelBody(block, group, r, j, 1); });
    });
  }

  // ---- Matrix products fused into their kernel ------------------------------------------------

  // Packs a fused product's weights in tile order (StoragePlan.h, PackedProduct): per block of
  // columns, per depth k, each slice's `width` weights side by side; zero past the columns.
  void emitPacking(const PackedProduct& packed) {
    const ir::Instr& product = *packed.product;
    const bool transposed = product.op == Op::Linear; // x @ W^T: W is [N, K]
    View w = view(product.operands[1]);
    View out{buffers_[packed.buffer], constant(0)};
    const int64_t slices = static_cast<int64_t>(packed.offsets.size());
    // Per slice (its offset, start and panel width read from small constant tables), per
    // column of the block, one loop over the depth: a few plain loops, which LLVM compiles
    // quickly, where unrolled slices and lanes would be dozens of address streams.
    auto table = [&](const std::vector<int64_t>& values, const char* name) {
      auto* type = llvm::ArrayType::get(i64_, values.size());
      std::vector<llvm::Constant*> elements;
      for (int64_t v : values)
        elements.push_back(llvm::ConstantInt::get(i64_, static_cast<uint64_t>(v)));
      return new llvm::GlobalVariable(*module_, type, true, llvm::GlobalValue::PrivateLinkage,
                                      llvm::ConstantArray::get(type, elements), name);
    };
    std::vector<int64_t> starts, widths;
    for (int64_t s = 0; s < slices; ++s) {
      starts.push_back(packed.sliceStart(s));
      widths.push_back(packed.panelWidth(s));
    }
    llvm::Value* offsetTable = table(packed.offsets, "slice_offsets");
    llvm::Value* startTable = table(starts, "slice_starts");
    llvm::Value* widthTable = table(widths, "slice_widths");
    auto lookup = [&](llvm::Value* array, llvm::Value* s) {
      return b_.CreateLoad(i64_, b_.CreateGEP(i64_, array, s));
    };
    RowRange blocks = share(constant(packed.blocks));
    forLoop(blocks.begin, blocks.end, constant(1), "pack", [&](llvm::Value* blk) {
      llvm::Value* block = b_.CreateGEP(
          f32_, out.base, b_.CreateMul(blk, constant(packed.depth * slices * packed.width)));
      forLoop(constant(0), constant(slices), constant(1), "packs", [&](llvm::Value* s) {
        llvm::Value* panelWidth = lookup(widthTable, s);
        llvm::Value* sliceBase = b_.CreateGEP(f32_, block, lookup(startTable, s));
        forLoop(constant(0), constant(packed.width), constant(1), "packl", [&](llvm::Value* l) {
          llvm::Value* local = b_.CreateAdd(b_.CreateMul(blk, constant(packed.width)), l);
          llvm::Value* inside = b_.CreateICmpSLT(local, constant(packed.columns));
          llvm::Value* column = b_.CreateAdd(local, lookup(offsetTable, s));
          llvm::Value* to = b_.CreateGEP(f32_, sliceBase, l);
          forLoop(constant(0), constant(packed.depth), constant(1), "packk", [&](llvm::Value* k) {
            llvm::Value* from =
                transposed ? elementPointer(w, column, k) : elementPointer(w, k, column);
            // Past the kernel's columns the address may be out of bounds: select it away.
            llvm::Value* safe = b_.CreateSelect(inside, from, w.base);
            llvm::Value* weight =
                b_.CreateSelect(inside, b_.CreateAlignedLoad(f32_, safe, llvm::Align(4)),
                                llvm::ConstantFP::get(f32_, 0.0));
            b_.CreateAlignedStore(weight, b_.CreateGEP(f32_, to, b_.CreateMul(k, panelWidth)),
                                  llvm::Align(4));
          });
        });
      });
    });
  }

  // A kernel led by a matrix product: per block of `width` columns, per tile of rows, the
  // product's columns of every slice the kernel reads are computed in registers, then the
  // kernel's elementwise work runs on them. Blocks are the outer loop so that a block's packed
  // weights stay in cache while every row of the batch uses them.
  void emitProductKernel(const ir::Block& block, const KernelGroup& group,
                         const PackedProduct& packed, llvm::Value* batchRows) {
    const ir::Instr& product = *block[group.first];
    const int64_t slices = static_cast<int64_t>(packed.offsets.size());
    const int64_t tileRows = packed.tileRows;
    std::vector<std::vector<const ir::Value*>> sliceValues(static_cast<size_t>(slices));
    for (size_t i = group.first + 1; i < group.last; ++i) {
      const ir::Instr& instr = *block[i];
      if (instr.op == Op::Slice && instr.operands[0] == &product.result) {
        auto at = std::find(packed.offsets.begin(), packed.offsets.end(),
                            instr.attrs.offset.constantValue());
        sliceValues[static_cast<size_t>(at - packed.offsets.begin())].push_back(&instr.result);
        continue;
      }
      for (const ir::Value* operand : instr.operands)
        if (!definedIn(block, group, operand) && !isImmediate(operand))
          view(operand);
      if (instr.op == Op::Slice)
        view(&instr.result);
    }
    View x = view(product.operands[0]);
    llvm::Value* weights = buffers_[packed.buffer];
    const int64_t fullBlocks = packed.columns / packed.width;
    const int64_t tailColumns = packed.columns - fullBlocks * packed.width;

    // A finished tile waits in a small stack array (in L1) while one copy of the elementwise
    // code loops over its rows, and over the last block's columns one at a time: copies per
    // row or per column would multiply what LLVM compiles.
    llvm::Type* vec = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(packed.width));
    llvm::IRBuilder<> entry(&fn_->getEntryBlock(), fn_->getEntryBlock().begin());
    llvm::Value* scratch = entry.CreateAlloca(vec, constant(tileRows * slices), "tile");
    auto stored = [&](llvm::Value* m, int64_t s) { // the tile's row m, slice s
      return b_.CreateGEP(vec, scratch,
                          b_.CreateAdd(b_.CreateMul(m, constant(slices)), constant(s)));
    };
    // The kernel's elementwise work on rows [firstRow, firstRow + rows) of block blk.
    auto epilogue = [&](llvm::Value* blk, llvm::Value* firstRow, llvm::Value* rows) {
      llvm::Value* j = b_.CreateMul(blk, constant(packed.width));
      auto inRegisters = [&](auto&& load) {
        std::unordered_map<const ir::Value*, llvm::Value*> values;
        for (int64_t s = 0; s < slices; ++s) {
          llvm::Value* sum = load(s);
          for (const ir::Value* v : sliceValues[static_cast<size_t>(s)])
            values[v] = sum;
        }
        return values;
      };
      auto full = [&] {
        forLoop(constant(0), rows, constant(1), "tilerow", [&](llvm::Value* m) {
          emitKernelBody(block, group, b_.CreateAdd(firstRow, m), j, packed.width,
                         inRegisters([&](int64_t s) { return b_.CreateLoad(vec, stored(m, s)); }));
        });
      };
      if (tailColumns == 0)
        return full();
      auto* fullBlock = llvm::BasicBlock::Create(context_, "full_block", fn_);
      auto* tailBlock = llvm::BasicBlock::Create(context_, "tail_block", fn_);
      auto* done = llvm::BasicBlock::Create(context_, "block_done", fn_);
      b_.CreateCondBr(b_.CreateICmpSLT(blk, constant(fullBlocks)), fullBlock, tailBlock);
      b_.SetInsertPoint(fullBlock);
      full();
      b_.CreateBr(done);
      b_.SetInsertPoint(tailBlock);
      llvm::Type* lane = llvm::FixedVectorType::get(f32_, 1);
      forLoop(constant(0), rows, constant(1), "tailrow", [&](llvm::Value* m) {
        forLoop(constant(0), constant(tailColumns), constant(1), "tailcol", [&](llvm::Value* l) {
          auto column = [&](int64_t s) { // lane l of the sums as a 1-lane vector
            llvm::Value* sum = b_.CreateLoad(vec, stored(m, s));
            return b_.CreateInsertElement(llvm::PoisonValue::get(lane),
                                          b_.CreateExtractElement(sum, l), uint64_t{0});
          };
          emitKernelBody(block, group, b_.CreateAdd(firstRow, m), b_.CreateAdd(j, l), 1,
                         inRegisters(column));
        });
      });
      b_.CreateBr(done);
      b_.SetInsertPoint(done);
    };

    // Full tiles of tileRows rows; the batch's last rows in tiles of half that height, then
    // single rows (three variants: one per height would cost compile time for little). Each
    // tile's rows then go through the one epilogue.
    const int64_t halfRows = std::max<int64_t>(1, tileRows / 2);
    llvm::Value* tiledRows = b_.CreateMul(b_.CreateSDiv(batchRows, constant(tileRows)),
                                          constant(tileRows), "tiled_rows");
    auto storeTile = [&](const Tile& sums, llvm::Value* firstSlot) {
      for (size_t m = 0; m < sums.size(); ++m)
        for (int64_t s = 0; s < slices; ++s)
          b_.CreateStore(sums[m][s],
                         stored(b_.CreateAdd(firstSlot, constant(static_cast<int64_t>(m))), s));
    };
    RowRange blocks = share(constant(packed.blocks)); // this thread's columns, every step
    forLoop(blocks.begin, blocks.end, constant(1), "block", [&](llvm::Value* blk) {
      forLoop(constant(0), batchRows, constant(tileRows), "tile", [&](llvm::Value* r) {
        llvm::Value* full = b_.CreateICmpSLT(r, tiledRows);
        llvm::Value* height = b_.CreateSelect(full, constant(tileRows), b_.CreateSub(batchRows, r));
        auto* fullTile = llvm::BasicBlock::Create(context_, "full_tile", fn_);
        auto* lastRows = llvm::BasicBlock::Create(context_, "last_rows", fn_);
        auto* computed = llvm::BasicBlock::Create(context_, "tile_computed", fn_);
        b_.CreateCondBr(full, fullTile, lastRows);
        b_.SetInsertPoint(fullTile);
        storeTile(emitTile(x, weights, packed, blk, r, tileRows), constant(0));
        b_.CreateBr(computed);
        b_.SetInsertPoint(lastRows);
        llvm::Value* halves =
            b_.CreateMul(b_.CreateSDiv(height, constant(halfRows)), constant(halfRows));
        forLoop(constant(0), halves, constant(halfRows), "halftile", [&](llvm::Value* m) {
          storeTile(emitTile(x, weights, packed, blk, b_.CreateAdd(r, m), halfRows), m);
        });
        if (halfRows > 1)
          forLoop(halves, height, constant(1), "lastrow", [&](llvm::Value* m) {
            storeTile(emitTile(x, weights, packed, blk, b_.CreateAdd(r, m), 1), m);
          });
        b_.CreateBr(computed);
        b_.SetInsertPoint(computed);
        epilogue(blk, r, height);
      });
    });
  }

  using Tile = std::vector<std::vector<llvm::Value*>>; // per row, one vector per slice

  // Rows [firstRow, firstRow + rows) of x times block `blk` of the packed weights. The slices
  // are accumulated in passes of as many as the tile's accumulators allow for this many rows
  // (a panel for a full tile, all of them for one row); each pass is one walk over the depth.
  Tile emitTile(const View& x, llvm::Value* weights, const PackedProduct& packed, llvm::Value* blk,
                llvm::Value* firstRow, int64_t rows) {
    const int64_t slices = packed.slices();
    const int64_t accumulators = packed.tileRows * packed.panelSlices;
    const int64_t perPass = std::clamp<int64_t>(accumulators / rows, 1, slices);
    llvm::Type* vec = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(packed.width));
    // Every address is a base computed once plus the depth (times the panel's width).
    std::vector<llvm::Value*> rowPointers;
    for (int64_t m = 0; m < rows; ++m)
      rowPointers.push_back(elementPointer(x, b_.CreateAdd(firstRow, constant(m)), constant(0)));
    llvm::Value* blockWeights = b_.CreateGEP(
        f32_, weights, b_.CreateMul(blk, constant(packed.depth * slices * packed.width)));

    Tile sums(static_cast<size_t>(rows), std::vector<llvm::Value*>(static_cast<size_t>(slices)));
    for (int64_t first = 0; first < slices; first += perPass) {
      const int64_t count = std::min(perPass, slices - first);
      std::vector<llvm::Value*> sliceWeights;
      for (int64_t s = first; s < first + count; ++s)
        sliceWeights.push_back(b_.CreateConstGEP1_64(f32_, blockWeights, packed.sliceStart(s)));
      // The accumulators are the depth loop's phis. It is not unrolled: the FMAs of one depth
      // already hide their latency, and a bigger body only costs compile time.
      llvm::BasicBlock* before = b_.GetInsertBlock();
      auto* header = llvm::BasicBlock::Create(context_, "depth", fn_);
      auto* exit = llvm::BasicBlock::Create(context_, "depth.exit", fn_);
      b_.CreateBr(header);
      b_.SetInsertPoint(header);
      llvm::PHINode* k = b_.CreatePHI(i64_, 2, "k");
      k->addIncoming(constant(0), before);
      Tile acc(static_cast<size_t>(rows));
      std::vector<std::vector<llvm::PHINode*>> phis(static_cast<size_t>(rows));
      for (int64_t m = 0; m < rows; ++m)
        for (int64_t s = 0; s < count; ++s) {
          phis[m].push_back(b_.CreatePHI(vec, 2));
          phis[m].back()->addIncoming(llvm::ConstantFP::get(vec, 0.0), before);
          acc[m].push_back(phis[m].back());
        }
      std::vector<llvm::Value*> w;
      for (int64_t s = 0; s < count; ++s)
        w.push_back(b_.CreateAlignedLoad(
            vec,
            b_.CreateGEP(f32_, sliceWeights[s],
                         b_.CreateMul(k, constant(packed.panelWidth(first + s)))),
            llvm::Align(4)));
      for (int64_t m = 0; m < rows; ++m) {
        llvm::Value* input = b_.CreateVectorSplat(
            static_cast<unsigned>(packed.width),
            b_.CreateAlignedLoad(f32_, b_.CreateGEP(f32_, rowPointers[m], k), llvm::Align(4)));
        for (int64_t s = 0; s < count; ++s)
          acc[m][s] = b_.CreateIntrinsic(llvm::Intrinsic::fma, {vec}, {input, w[s], acc[m][s]});
      }
      llvm::Value* next = b_.CreateAdd(k, constant(1));
      for (int64_t m = 0; m < rows; ++m)
        for (int64_t s = 0; s < count; ++s)
          phis[m][s]->addIncoming(acc[m][s], header);
      k->addIncoming(next, header);
      b_.CreateCondBr(b_.CreateICmpSLT(next, constant(packed.depth)), header, exit);
      b_.SetInsertPoint(exit);
      for (int64_t m = 0; m < rows; ++m)
        for (int64_t s = 0; s < count; ++s)
          sums[m][first + s] = acc[m][s];
    }
    return sums;
  }

  static bool isImmediate(const ir::Value* v) {
    return !v->isArgument() && v->def->op == Op::Const;
  }

  // A layer norm fused into a kernel: its values are computed where they are read.
  static bool isNormalised(const ir::Value* v) {
    return !v->isArgument() && v->def->op == Op::LayerNorm && v->def->kernel >= 0;
  }

  // Sum over columns [0, n) of row r of `x`, each element mapped by `f`: vector lanes, then the
  // rest one at a time, accumulated in stack slots that LLVM promotes to registers.
  template <class F> llvm::Value* rowSum(const View& x, llvm::Value* r, int64_t n, F&& f) {
    const int64_t width = target_.vectorWidth;
    llvm::Type* vec = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(width));
    llvm::IRBuilder<> entry(&fn_->getEntryBlock(), fn_->getEntryBlock().begin());
    llvm::AllocaInst* lanes = entry.CreateAlloca(vec);
    llvm::AllocaInst* rest = entry.CreateAlloca(f32_);
    b_.CreateStore(llvm::ConstantFP::get(vec, 0.0), lanes);
    b_.CreateStore(llvm::ConstantFP::get(f32_, 0.0), rest);
    const int64_t vectorCols = n - n % width;
    if (vectorCols > 0)
      forLoop(constant(0), constant(vectorCols), constant(width), "sum", [&](llvm::Value* j) {
        llvm::Value* v = f(b_.CreateAlignedLoad(vec, elementPointer(x, r, j), llvm::Align(4)));
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(vec, lanes), v), lanes);
      });
    if (vectorCols < n)
      forLoop(constant(vectorCols), constant(n), constant(1), "sumtail", [&](llvm::Value* j) {
        llvm::Value* v = f(b_.CreateAlignedLoad(f32_, elementPointer(x, r, j), llvm::Align(4)));
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(f32_, rest), v), rest);
      });
    llvm::Value* reduced =
        b_.CreateFAddReduce(llvm::ConstantFP::get(f32_, 0.0), b_.CreateLoad(vec, lanes));
    llvm::cast<llvm::Instruction>(reduced)->setHasAllowReassoc(true);
    return b_.CreateFAdd(reduced, b_.CreateLoad(f32_, rest));
  }

  struct RowStatistics {
    llvm::Value* mean = nullptr;
    llvm::Value* inverseStd = nullptr;
  };

  // Mean and 1/sqrt(var + eps) of row r, in two passes (one pass of sum and sum of squares
  // cancels badly when the mean is large; PyTorch is careful here too).
  RowStatistics emitRowStatistics(const ir::Instr& norm, llvm::Value* r) {
    const ir::Value* x = norm.operands[0];
    const int64_t n = columnsOf(x);
    View in = view(x);
    llvm::Value* count = llvm::ConstantFP::get(f32_, static_cast<double>(n));
    llvm::Value* mean = b_.CreateFDiv(rowSum(in, r, n, [](llvm::Value* v) { return v; }), count);
    auto squaredDeviation = [&](llvm::Value* v) {
      llvm::Value* m = mean;
      if (auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(v->getType()))
        m = b_.CreateVectorSplat(vt->getNumElements(), mean);
      llvm::Value* d = b_.CreateFSub(v, m);
      return b_.CreateFMul(d, d);
    };
    llvm::Value* variance = b_.CreateFDiv(rowSum(in, r, n, squaredDeviation), count);
    llvm::Value* std = b_.CreateIntrinsic(
        llvm::Intrinsic::sqrt, {f32_},
        {b_.CreateFAdd(variance, llvm::ConstantFP::get(f32_, norm.attrs.value))});
    return {mean, b_.CreateFDiv(llvm::ConstantFP::get(f32_, 1.0), std)};
  }

  // The normalised values of `norm` (a fused layer norm) at columns offset + j onwards.
  llvm::Value* normalised(const ir::Value* norm, llvm::Value* r, llvm::Value* j, int64_t offset,
                          int64_t width) {
    const RowStatistics& stats = rowStatistics_.at(norm);
    llvm::Type* vec = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(width));
    llvm::Value* column = b_.CreateAdd(j, constant(offset));
    llvm::Value* x = b_.CreateAlignedLoad(
        vec, elementPointer(view(norm->def->operands[0]), r, column), llvm::Align(4));
    auto splat = [&](llvm::Value* s) {
      return b_.CreateVectorSplat(static_cast<unsigned>(width), s);
    };
    return b_.CreateFMul(b_.CreateFSub(x, splat(stats.mean)), splat(stats.inverseStd));
  }

  static bool definedIn(const ir::Block& block, const KernelGroup& group, const ir::Value* v) {
    for (size_t i = group.first; i < group.last; ++i)
      if (&block[i]->result == v)
        return true;
    return false;
  }

  // `values`: what is already in registers (the slices of a fused product's tile).
  void emitKernelBody(const ir::Block& block, const KernelGroup& group, llvm::Value* r,
                      llvm::Value* j, int64_t width,
                      std::unordered_map<const ir::Value*, llvm::Value*> values = {}) {
    llvm::Type* vec = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(width));
    auto splat = [&](double v) { return llvm::ConstantFP::get(vec, v); };
    auto load = [&](const ir::Value* v) -> llvm::Value* {
      View at = view(v);
      if (v->shape.empty()) // a scalar in memory: one float for every lane
        return b_.CreateVectorSplat(static_cast<unsigned>(width),
                                    b_.CreateAlignedLoad(f32_, at.base, llvm::Align(4)));
      return b_.CreateAlignedLoad(vec, elementPointer(at, r, j), llvm::Align(4));
    };
    auto get = [&](const ir::Value* v) -> llvm::Value* {
      if (auto it = values.find(v); it != values.end())
        return it->second;
      llvm::Value* loaded = isImmediate(v) ? splat(v->def->attrs.value) : load(v);
      values[v] = loaded;
      return loaded;
    };
    for (size_t i = group.first; i < group.last; ++i) {
      const ir::Instr& instr = *block[i];
      if (values.count(&instr.result) || plan_.packedProductOf(&instr))
        continue; // in registers already
      llvm::Value* result = nullptr;
      if (instr.op == Op::LayerNorm)
        result = normalised(&instr.result, r, j, 0, width);
      else if (instr.op == Op::Slice && isNormalised(instr.operands[0]))
        result = normalised(instr.operands[0], r, j, instr.attrs.offset.constantValue(), width);
      else if (instr.op == Op::Slice)
        result = load(&instr.result);
      else
        result = compute(instr, get, vec);
      values[&instr.result] = result;
      for (size_t u = 0; u < cell_.updates.size(); ++u)
        if (plan_.updatedInKernel[u] && cell_.updates[u].next == &instr.result)
          b_.CreateAlignedStore(result, elementPointer(views_.at(cell_.states[u].get()), r, j),
                                llvm::Align(4));
      if (views_.count(&instr.result) && instr.op != Op::Slice) {
        View out = views_.at(&instr.result);
        llvm::Value* at = instr.result.shape.empty() ? out.base : elementPointer(out, r, j);
        llvm::Value* stored = result;
        if (instr.result.shape.empty())
          stored = b_.CreateExtractElement(result, uint64_t{0});
        b_.CreateAlignedStore(stored, at, llvm::Align(4));
      }
    }
  }

  template <class Get> llvm::Value* compute(const ir::Instr& instr, Get& get, llvm::Type* vec) {
    auto operand = [&](size_t k) { return get(instr.operands[k]); };
    auto intrinsic2 = [&](llvm::Intrinsic::ID id, llvm::Value* x, llvm::Value* y) {
      return b_.CreateIntrinsic(id, {vec}, {x, y});
    };
    const ir::Attrs& a = instr.attrs;
    switch (instr.op) {
    case Op::Const:
      return llvm::ConstantFP::get(vec, a.value);
    case Op::Add:
      return b_.CreateFAdd(operand(0), operand(1));
    case Op::Sub:
      return b_.CreateFSub(operand(0), operand(1));
    case Op::Mul:
      return b_.CreateFMul(operand(0), operand(1));
    case Op::Div:
      return b_.CreateFDiv(operand(0), operand(1));
    case Op::Min: // llvm.minimum/maximum propagate NaN, as torch.minimum/maximum do
      return intrinsic2(llvm::Intrinsic::minimum, operand(0), operand(1));
    case Op::Max:
      return intrinsic2(llvm::Intrinsic::maximum, operand(0), operand(1));
    case Op::Neg:
      return b_.CreateFNeg(operand(0));
    case Op::Relu:
      return intrinsic2(llvm::Intrinsic::maximum, operand(0), llvm::ConstantFP::get(vec, 0.0));
    case Op::Clamp:
      return intrinsic2(
          llvm::Intrinsic::minimum,
          intrinsic2(llvm::Intrinsic::maximum, operand(0), llvm::ConstantFP::get(vec, a.lo)),
          llvm::ConstantFP::get(vec, a.hi));
    case Op::Sqrt:
      return b_.CreateIntrinsic(llvm::Intrinsic::sqrt, {vec}, {operand(0)});
    case Op::Exp:
      return emitExp(b_, operand(0));
    case Op::Log:
      return emitLog(b_, operand(0));
    case Op::Sigmoid:
      return emitSigmoid(b_, operand(0));
    case Op::Tanh:
      return emitTanh(b_, operand(0));
    case Op::Dropout:
      return operand(0); // inference: identity (training runs on the interpreter)
    default:
      RNNC_INTERNAL_CHECK(false, "no kernel code for " + std::string(ir::opName(instr.op)));
    }
  }

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

} // namespace

std::unique_ptr<llvm::Module> emitCell(llvm::LLVMContext& context, const ir::Cell& cell,
                                       const StoragePlan& plan, const Target& target,
                                       const std::string& functionName) {
  return Emitter(context, cell, plan, target, functionName).emit();
}

} // namespace rnnc::codegen

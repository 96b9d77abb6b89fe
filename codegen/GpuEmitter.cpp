#include "codegen/GpuEmitter.h"

#include "codegen/EmitContext.h"
#include "codegen/KernelEmitter.h"
#include "ir/Error.h"

#include <array>
#include <cstddef>

namespace rnnc::codegen {

using ir::Op;
using Kind = GpuRegion::Kind;

namespace {

class GpuEmitter : public EmitContext {
public:
  GpuEmitter(llvm::LLVMContext& llvmContext, const ir::Cell& cell, const StoragePlan& plan,
             const std::vector<GpuRegion>& regions, const Target& target)
      : EmitContext(llvmContext, cell, plan, target, "rnnc_unused"), regions_(regions),
        kernels_(*this) {
    denseInputs = true; // GpuCell's inputs are whole tensors, on the device or emulated
  }

  std::unique_ptr<llvm::Module> emit();

private:
  llvm::Function* emitRegion(size_t index);
  // The region's work on one item (its grid-stride loop's body).
  void emitItem(const GpuRegion& region, llvm::Value* item, llvm::Value* rows);
  void emitSplitDepthProduct(const GpuRegion& region, llvm::Value* item, llvm::Value* rows);
  // One block tile (PackedProduct::blockTiled) as thread blockThread_ of its block on a GPU, or
  // (emulated) as every thread of the block in turn between the barriers.
  void emitBlockTile(const GpuRegion& region, llvm::Value* item, llvm::Value* rows);
  // The shared memory a block tile stages its chunks in: the module's (address space 3) on a
  // GPU, the emulated block's own stack on the host.
  llvm::Value* sharedMemory(int64_t floats);
  // What a split-depth product starts an item with: which values of the kernel are which slice's
  // sums, views of what else it reads, the item's row tile and column, its rows clamped to the last
  // (rows past it are read as the last and not stored: no branch in the depth loop), and its
  // sums, zero.
  struct ProductTile {
    std::vector<std::vector<const ir::Value*>> sliceValues;
    View x, result; // result: a standalone product's own buffer
    llvm::Value* firstRow = nullptr;
    llvm::Value* j = nullptr;
    std::vector<llvm::Value*> rows;
    std::vector<llvm::AllocaInst*> sums; // [row * slices + slice]
  };
  ProductTile startProduct(const GpuRegion& region, llvm::Value* item, llvm::Value* rows);
  // Element (r, j), given its sum for each slice: the kernel's elementwise work (a standalone
  // product: the sum stored).
  void finishElement(const GpuRegion& region, const ProductTile& tile, llvm::Value* r,
                     llvm::Value* j, const std::vector<llvm::Value*>& sliceSums);
  // Which values of the kernel are which slice's sums and views of what else the product and
  // its kernel read (ProductTile's first three members).
  void productViews(const GpuRegion& region, ProductTile& tile);
  // The sum of `value` over the warp's lanes, in every lane (shuffles, butterfly order).
  llvm::Value* warpSum(llvm::Value* value);
  void emitPacking(const PackedProduct& packed, llvm::Value* item);
  void emitInstruction(const ir::Instr& instr, llvm::Value* item);
  void emitStepEnd(const GpuRegion& region, llvm::Value* item);

  // The entry points: kernels for a GPU, the emulation for the host.
  void emitKernels(const std::vector<llvm::Function*>& regionFunctions);
  void emitEmulation(const std::vector<llvm::Function*>& regionFunctions);
  void gridBarrier(llvm::Value* counter, llvm::Value* generation);
  void hostBarrier(llvm::Value* counter, llvm::Value* generation, llvm::Value* blocks);
  void emitPersistentSteps(const std::vector<llvm::Function*>& regionFunctions, llvm::Value* args,
                           llvm::Value* counter, llvm::Value* me, llvm::Value* all);
  llvm::Value* specialRegister(llvm::Intrinsic::ID id);
  // The tensors and buffers are all in the GPU's global memory: said so (a cast to the global
  // address space and back, which LLVM's address space inference turns into ld.global and
  // st.global instead of generic loads and stores that check the address's space each time).
  void markGlobal() {
    llvm::Type* global = llvm::PointerType::get(llvmContext, 1);
    auto mark = [&](llvm::Value*& p) {
      p = b.CreateAddrSpaceCast(b.CreateAddrSpaceCast(p, global), ptr);
    };
    for (auto* list : {&params, &inputs, &states, &buffers})
      for (llvm::Value*& p : *list)
        mark(p);
    mark(output);
  }

  llvm::Value* load(const View& v, llvm::Value* r, llvm::Value* c) {
    return b.CreateAlignedLoad(f32, elementPointer(v, r, c), llvm::Align(4));
  }
  void store(llvm::Value* value, const View& v, llvm::Value* r, llvm::Value* c) {
    b.CreateAlignedStore(value, elementPointer(v, r, c), llvm::Align(4));
  }
  // A float in the function's entry block (promoted to a register by LLVM).
  llvm::AllocaInst* slot(const char* name) {
    llvm::IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
    return entry.CreateAlloca(f32, nullptr, name);
  }
  // The sum over j in [0, n) of term(j), in order.
  template <class Term> llvm::Value* sum(int64_t n, Term&& term) {
    llvm::AllocaInst* total = slot("sum");
    b.CreateStore(llvm::ConstantFP::get(f32, 0.0), total);
    forLoop(constant(0), constant(n), constant(1), "sum", [&](llvm::Value* j) {
      b.CreateStore(b.CreateFAdd(b.CreateLoad(f32, total), term(j)), total);
    });
    return b.CreateLoad(f32, total);
  }
  // sums[m * slices + s] += x(tileRow[m], k) * *weight(k, s) for k = begin, begin + stride, ...
  // below end: kGpuDepthUnroll depths' loads issued before their FMAs, then one depth at a time
  // for the rest, so that many loads are in flight at once (a depth at a time waited out a
  // load's latency per depth).
  template <class Weight>
  void accumulate(const std::vector<llvm::AllocaInst*>& sums, const View& x,
                  const std::vector<llvm::Value*>& tileRow, int64_t slices, llvm::Value* begin,
                  int64_t end, int64_t stride, Weight&& weight) {
    const int64_t rows = static_cast<int64_t>(tileRow.size());
    auto depths = [&](llvm::Value* k, int64_t n) {
      std::vector<llvm::Value*> w, xs;
      for (int64_t u = 0; u < n; ++u) {
        llvm::Value* ku = b.CreateAdd(k, constant(u * stride));
        for (int64_t s = 0; s < slices; ++s)
          w.push_back(b.CreateAlignedLoad(f32, weight(ku, s), llvm::Align(4)));
        for (int64_t m = 0; m < rows; ++m)
          xs.push_back(load(x, tileRow[static_cast<size_t>(m)], ku));
      }
      for (int64_t u = 0; u < n; ++u)
        for (int64_t m = 0; m < rows; ++m)
          for (int64_t s = 0; s < slices; ++s) {
            llvm::AllocaInst* acc = sums[static_cast<size_t>(m * slices + s)];
            b.CreateStore(fmuladd(xs[static_cast<size_t>(u * rows + m)],
                                  w[static_cast<size_t>(u * slices + s)], b.CreateLoad(f32, acc)),
                          acc);
          }
    };
    llvm::Value* group = constant(kGpuDepthUnroll * stride);
    // begin + a whole number of groups, the last group ending at or before end.
    llvm::Value* grouped = b.CreateAdd(
        begin, b.CreateMul(b.CreateSDiv(b.CreateSub(constant(end), begin), group), group));
    forLoop(begin, grouped, group, "depths", [&](llvm::Value* k) { depths(k, kGpuDepthUnroll); });
    forLoop(grouped, constant(end), constant(stride), "depth",
            [&](llvm::Value* k) { depths(k, 1); });
  }

  llvm::Value* fmuladd(llvm::Value* x, llvm::Value* y, llvm::Value* z) {
    return b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {f32}, {x, y, z});
  }

  const std::vector<GpuRegion>& regions_;
  KernelEmitter kernels_;
  View outputRows_;                    // a step region's output rows
  llvm::Value* lane_ = nullptr;        // a split-depth product's lane on a GPU; null when emulated
  llvm::Value* blockThread_ = nullptr; // a block tile's thread in its block on a GPU; likewise
};

std::unique_ptr<llvm::Module> GpuEmitter::emit() {
  llvm::Function* unused = fn; // EmitContext's CPU run function: not a GPU entry
  std::vector<llvm::Function*> regionFunctions;
  for (size_t i = 0; i < regions_.size(); ++i)
    regionFunctions.push_back(emitRegion(i));
  if (target.isGpu())
    emitKernels(regionFunctions);
  else
    emitEmulation(regionFunctions);
  unused->eraseFromParent();
  // The CPU runtime's helpers are never called here.
  for (llvm::Function& f : llvm::make_early_inc_range(module->functions()))
    if (f.isDeclaration() && f.use_empty() && !f.isIntrinsic())
      f.eraseFromParent();
  return std::move(module);
}

llvm::Function* GpuEmitter::emitRegion(size_t index) {
  const GpuRegion& region = regions_[index];
  auto* type =
      llvm::FunctionType::get(llvm::Type::getVoidTy(llvmContext), {ptr, i64, i64, i64}, false);
  fn = llvm::Function::Create(type, llvm::Function::InternalLinkage,
                              kGpuRegionPrefix + std::to_string(index), *module);
  fn->addFnAttr("target-cpu", target.cpu);
  fn->addFnAttr("target-features", target.features);
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  if (target.isGpu())
    fn->addFnAttr(llvm::Attribute::AlwaysInline);
  b.SetInsertPoint(llvm::BasicBlock::Create(llvmContext, "entry", fn));
  loadArguments(fn->getArg(0));
  if (target.isGpu())
    markGlobal();
  llvm::Value* t = fn->getArg(1);
  switch (region.phase) {
  case GpuPhase::Params:
  case GpuPhase::Final:
    paramViews();
    break;
  case GpuPhase::Pre:
    sequenceViews();
    break;
  case GpuPhase::Step:
    outputRows_ = stepViews(t);
    break;
  }
  llvm::Value* rows = region.rows == Rows::Sequence ? b.CreateMul(steps, batch, "rows")
                      : region.rows == Rows::Step   ? batch
                                                    : constant(region.fixedRows);
  llvm::Value* rowGroups = b.CreateUDiv(b.CreateAdd(rows, constant(region.rowsPerItem - 1)),
                                        constant(region.rowsPerItem));
  llvm::Value* items = b.CreateMul(rowGroups, constant(region.itemsPerRow), "items");
  // Views are made before the loop so that their address arithmetic is not repeated.
  if (region.kind == Kind::Kernel || region.kind == Kind::RowKernel)
    kernels_.emitViews(*region.block, {region.unit.first, region.unit.last});
  llvm::Value* first = fn->getArg(2);
  llvm::Value* stride = fn->getArg(3);
  lane_ = nullptr;
  if (region.kind == Kind::Product && region.packed->splitDepth && target.isGpu()) {
    // A warp per item: the grid-stride loop runs over warps (a block is whole warps), the lane
    // works inside the item. The emulation runs an item's lanes one after the other instead.
    lane_ = b.CreateURem(first, constant(kGpuWarpLanes), "lane");
    first = b.CreateUDiv(first, constant(kGpuWarpLanes), "warp");
    stride = b.CreateUDiv(stride, constant(kGpuWarpLanes), "warps");
  }
  blockThread_ = nullptr;
  if (region.kind == Kind::Product && region.packed->blockTiled && target.isGpu()) {
    // A block per item: the grid-stride loop runs over blocks (of blockThreads threads, as
    // launched), the same items for every thread of a block, so that all of them meet at its
    // barriers. Emulated, `first` is the block and its threads run inside the item.
    llvm::Value* blockThreads = constant(region.packed->blockThreads);
    blockThread_ = b.CreateURem(first, blockThreads, "block_thread");
    first = b.CreateUDiv(first, blockThreads, "block");
    stride = b.CreateUDiv(stride, blockThreads, "blocks");
  }
  forLoop(first, items, stride, "item", [&](llvm::Value* item) { emitItem(region, item, rows); });
  b.CreateRetVoid();
  return fn;
}

void GpuEmitter::emitItem(const GpuRegion& region, llvm::Value* item, llvm::Value* rows) {
  const KernelGroup group{region.unit.first, region.unit.last};
  switch (region.kind) {
  case Kind::Kernel: {
    llvm::Value* cols = constant(region.itemsPerRow);
    kernels_.emitKernelBody(*region.block, group, b.CreateUDiv(item, cols),
                            b.CreateURem(item, cols), 1);
    return;
  }
  case Kind::RowKernel:
    kernels_.emitKernelRow(*region.block, group, item, kernelSpace(*region.block, group).cols);
    return;
  case Kind::Product:
    if (region.packed->blockTiled)
      return emitBlockTile(region, item, rows);
    return emitSplitDepthProduct(region, item, rows);
  case Kind::Packing:
    return emitPacking(*region.packed, item);
  case Kind::Instruction:
    return emitInstruction(*(*region.block)[region.unit.first], item);
  case Kind::StepOutputs:
  case Kind::StepStates:
  case Kind::FinalStates:
    return emitStepEnd(region, item);
  }
}

void GpuEmitter::finishElement(const GpuRegion& region, const ProductTile& tile, llvm::Value* r,
                               llvm::Value* j, const std::vector<llvm::Value*>& sliceSums) {
  if (!region.unit.kernel) {
    store(sliceSums[0], tile.result, r, j);
    return;
  }
  llvm::Type* lane = llvm::FixedVectorType::get(f32, 1);
  std::unordered_map<const ir::Value*, llvm::Value*> values;
  for (size_t s = 0; s < sliceSums.size(); ++s) {
    llvm::Value* vector =
        b.CreateInsertElement(llvm::PoisonValue::get(lane), sliceSums[s], uint64_t{0});
    for (const ir::Value* v : tile.sliceValues[s])
      values[v] = vector;
  }
  kernels_.emitKernelBody(*region.block, {region.unit.first, region.unit.last}, r, j, 1,
                          std::move(values));
}

void GpuEmitter::productViews(const GpuRegion& region, ProductTile& tile) {
  const PackedProduct& packed = *region.packed;
  const ir::Block& block = *region.block;
  const bool fused = region.unit.kernel;
  const KernelGroup group{region.unit.first, region.unit.last};
  for (size_t i = fused ? group.first + 1 : 0; fused && i < group.last; ++i) {
    const ir::Instr& instr = *block[i];
    if (instr.op == Op::Slice && instr.operands[0] == &packed.product->result)
      continue; // in registers
    for (const ir::Value* operand : instr.operands)
      if (!KernelEmitter::definedIn(block, group, operand) && !KernelEmitter::isImmediate(operand))
        view(operand);
    if (instr.op == Op::Slice)
      view(&instr.result);
  }
  tile.sliceValues = sliceValuesOf(block, fused ? &group : nullptr, packed);
  tile.x = view(packed.product->operands[0]);
  if (!fused)
    tile.result = view(&packed.product->result);
}

GpuEmitter::ProductTile GpuEmitter::startProduct(const GpuRegion& region, llvm::Value* item,
                                                 llvm::Value* rows) {
  const PackedProduct& packed = *region.packed;
  ProductTile tile;
  productViews(region, tile);
  // Consecutive items take consecutive columns of one row tile (which share its rows of x in
  // L1; for split-depth warps, a column's row tiles one after another were no faster on an
  // H200).
  llvm::Value* columns = constant(packed.columns);
  tile.firstRow = b.CreateMul(b.CreateUDiv(item, columns), constant(packed.tileRows));
  tile.j = b.CreateURem(item, columns, "j");
  llvm::Value* lastRow = b.CreateSub(rows, constant(1));
  for (int64_t m = 0; m < packed.tileRows; ++m) {
    llvm::Value* r = b.CreateAdd(tile.firstRow, constant(m));
    tile.rows.push_back(b.CreateSelect(b.CreateICmpULT(r, rows), r, lastRow));
  }
  for (int64_t k = 0; k < packed.tileRows * packed.slices(); ++k) {
    tile.sums.push_back(slot("acc"));
    b.CreateStore(llvm::ConstantFP::get(f32, 0.0), tile.sums.back());
  }
  return tile;
}

llvm::Value* GpuEmitter::sharedMemory(int64_t floats) {
  llvm::Type* type = llvm::ArrayType::get(f32, static_cast<uint64_t>(floats));
  if (!target.isGpu()) {
    llvm::IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
    llvm::AllocaInst* memory = entry.CreateAlloca(type, nullptr, "shared");
    memory->setAlignment(llvm::Align(16));
    return memory;
  }
  // One array for the module, as large as the largest tile's: a kernel runs one region at a
  // time (the persistent kernel's are separated by barriers).
  const char* name = "rnnc_shared";
  llvm::GlobalVariable* shared = module->getNamedGlobal(name);
  if (shared && shared->getValueType()->getArrayNumElements() >= static_cast<uint64_t>(floats))
    return shared;
  auto* grown = new llvm::GlobalVariable(*module, type, false, llvm::GlobalValue::InternalLinkage,
                                         llvm::UndefValue::get(type), name, nullptr,
                                         llvm::GlobalValue::NotThreadLocal, 3);
  grown->setAlignment(llvm::Align(16));
  if (shared) {
    grown->takeName(shared);
    shared->replaceAllUsesWith(grown);
    shared->eraseFromParent();
  }
  return grown;
}

// Item (row tile, column block) of a block-tiled product. The block's threads are
// `depthGroups` groups, each a grid of row groups by column groups: thread (g, tr, tc) sums rows
// tr * threadRows + m by columns tc * threadColumns + c of every slice over group g's part of
// the depth (a run of whole chunks). Per chunk each group copies the tile's rows of x
// (transposed: a thread's rows at one depth side by side) and the chunk's packed weights to its
// part of shared memory, the block meets at a barrier, each group accumulates from its part,
// and the block meets again before the next chunk overwrites it. Then (several groups) every
// thread stores its sums to shared memory and each finishes its share of the elements from the
// groups' sums. Emulated, each of those phases runs the block's threads in turn and the
// registers are arrays of every thread's: the barriers are where one phase's loop ends.
void GpuEmitter::emitBlockTile(const GpuRegion& region, llvm::Value* item, llvm::Value* rows) {
  llvm::Value* thread = blockThread_;
  const PackedProduct& packed = *region.packed;
  const int64_t slices = packed.slices(), threads = packed.blockThreads;
  const int64_t groups = packed.depthGroups, groupThreads = threads / groups;
  const int64_t tm = packed.threadRows, tn = packed.threadColumns, chunk = packed.depthChunk;
  const int64_t columnGroups = packed.width / tn, sums = tm * tn * slices;
  const int64_t xStride = packed.sharedRowStride(), wPerDepth = packed.width * slices;
  const int64_t wStride = packed.sharedWeightStride();
  const int64_t chunks = packed.packedDepth() / chunk;
  const int64_t groupChunks = (chunks + groups - 1) / groups;
  const bool emulated = thread == nullptr;
  ProductTile tile;
  productViews(region, tile);
  llvm::Value* columnBlock = b.CreateURem(item, constant(packed.blocks), "column_block");
  llvm::Value* firstRow =
      b.CreateMul(b.CreateUDiv(item, constant(packed.blocks)), constant(packed.tileRows));
  llvm::Value* firstColumn = b.CreateMul(columnBlock, constant(packed.width));
  llvm::Value* lastRow = b.CreateSub(rows, constant(1));
  llvm::Value* shared = sharedMemory(packed.sharedFloats());
  // The weights of this column block: chunk after chunk, contiguous.
  llvm::Value* blockWeights = b.CreateGEP(
      f32, buffers[packed.buffer],
      b.CreateMul(columnBlock, constant(packed.packedDepth() * wPerDepth), "block_weights"));

  // A thread's registers: on a GPU its own; emulated, the block's threads' side by side.
  auto registers = [&](int64_t count, const char* name) {
    std::vector<llvm::AllocaInst*> slots;
    llvm::AllocaInst* array = nullptr;
    if (emulated) {
      llvm::IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
      array = entry.CreateAlloca(f32, constant(threads * count), name);
    } else {
      for (int64_t i = 0; i < count; ++i)
        slots.push_back(slot(name));
    }
    return [this, slots, array, count](llvm::Value* t, int64_t i) -> llvm::Value* {
      if (!array)
        return slots[static_cast<size_t>(i)];
      return b.CreateGEP(f32, array, b.CreateAdd(b.CreateMul(t, constant(count)), constant(i)));
    };
  };
  const bool tensor = packed.tensorCores;
  const int64_t accumulators = tensor ? 4 * packed.warpTileRows * packed.warpTileColumns : sums;
  auto accumulator = registers(accumulators, "acc");
  auto sumIndex = [&](int64_t m, int64_t c, int64_t s) { return (m * tn + c) * slices + s; };
  // A thread's columns: its column group's, in pieces of pieceColumns adjacent columns (whose
  // slices make up to 4 floats, one vector load), piece q of every column group side by side,
  // so that the lanes of a warp load adjacent runs of shared memory at each depth. (Each
  // thread's tn columns in one run put the lanes' vector loads 32 bytes apart: two to a bank,
  // and the input projection ran at 38% of the FMA peak, its shared-memory loads 91% busy.)
  const int64_t pieceColumns =
      slices < 4 && 4 % slices == 0 && tn % (4 / slices) == 0 ? 4 / slices : 1;
  auto threadColumn = [&](llvm::Value* columnGroup, int64_t c) {
    const int64_t piece = c / pieceColumns;
    return b.CreateAdd(b.CreateMul(b.CreateAdd(constant(piece * columnGroups), columnGroup),
                                   constant(pieceColumns)),
                       constant(c % pieceColumns));
  };
  // Each thread of the block: on a GPU the one running; emulated, all in turn.
  auto eachThread = [&](const char* name, auto&& body) {
    if (!emulated)
      return body(thread);
    forLoop(constant(0), constant(threads), constant(1), name, body);
  };
  auto barrier = [&] {
    if (!emulated)
      b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
  };
  auto groupOf = [&](llvm::Value* t) { return b.CreateUDiv(t, constant(groupThreads)); };
  auto inGroup = [&](llvm::Value* t) { return b.CreateURem(t, constant(groupThreads)); };
  // Where chunk i of thread t's group starts: each group a run of groupChunks chunks.
  auto chunkStart = [&](llvm::Value* t, llvm::Value* i) {
    return b.CreateMul(b.CreateAdd(b.CreateMul(groupOf(t), constant(groupChunks)), i),
                       constant(chunk));
  };
  auto groupShared = [&](llvm::Value* t) {
    return b.CreateGEP(f32, shared, b.CreateMul(groupOf(t), constant(packed.stageFloats())));
  };

  eachThread("zero", [&](llvm::Value* t) {
    for (int64_t i = 0; i < accumulators; ++i)
      b.CreateStore(llvm::ConstantFP::get(f32, 0.0), accumulator(t, i));
  });
  // Staging a chunk: x[row, k0 + kk] at xs[kk * xStride + row] (zero past the depth, rows past
  // the last read as the last), the weights as they are packed (zero past the packed depth: a
  // group's run past the end), four floats at a time; thread u of a group takes elements u,
  // u + groupThreads, ... of each. The global loads go to registers first (the next chunk's
  // issued before this one's FMAs, so that their latency is hidden behind them), and from
  // there to shared memory once the block has finished with the chunk before.
  const int64_t xElements = packed.tileRows * chunk, quads = chunk * wPerDepth / 4;
  const int64_t xPerThread = (xElements + groupThreads - 1) / groupThreads;
  const int64_t quadsPerThread = (quads + groupThreads - 1) / groupThreads;
  auto stagedValue = registers(xPerThread + 4 * quadsPerThread, "staged");
  // Element i of a thread's share of `count` (clamped to the last: its load is then in bounds
  // and its store skipped), and whether it is one (null: always).
  auto element = [&](llvm::Value* u, int64_t i, int64_t count) {
    llvm::Value* e = b.CreateAdd(u, constant(i * groupThreads));
    if ((i + 1) * groupThreads <= count)
      return std::pair<llvm::Value*, llvm::Value*>{e, nullptr};
    llvm::Value* inside = b.CreateICmpULT(e, constant(count));
    return std::pair<llvm::Value*, llvm::Value*>{b.CreateSelect(inside, e, constant(count - 1)),
                                                 inside};
  };
  llvm::Type* quad = llvm::FixedVectorType::get(f32, 4);
  llvm::Value* zero = llvm::ConstantFP::get(f32, 0.0);
  auto fetch = [&](llvm::Value* t, llvm::Value* k0) {
    llvm::Value* u = inGroup(t);
    for (int64_t i = 0; i < xPerThread; ++i) {
      llvm::Value* e = element(u, i, xElements).first;
      llvm::Value* row = b.CreateAdd(firstRow, b.CreateUDiv(e, constant(chunk)));
      llvm::Value* k = b.CreateAdd(k0, b.CreateURem(e, constant(chunk)));
      llvm::Value* inDepth = b.CreateICmpULT(k, constant(packed.depth));
      llvm::Value* value = load(tile.x, b.CreateSelect(b.CreateICmpULT(row, rows), row, lastRow),
                                b.CreateSelect(inDepth, k, constant(packed.depth - 1)));
      b.CreateStore(b.CreateSelect(inDepth, value, zero), stagedValue(t, i));
    }
    llvm::Value* inPacked = b.CreateICmpULT(k0, constant(packed.packedDepth()));
    llvm::Value* from =
        b.CreateGEP(f32, blockWeights,
                    b.CreateMul(b.CreateSelect(inPacked, k0, constant(0)), constant(wPerDepth)));
    for (int64_t i = 0; i < quadsPerThread; ++i) {
      llvm::Value* offset = b.CreateMul(element(u, i, quads).first, constant(4));
      llvm::Value* value =
          b.CreateAlignedLoad(quad, b.CreateGEP(f32, from, offset), llvm::Align(16));
      for (int64_t l = 0; l < 4; ++l)
        b.CreateStore(
            b.CreateSelect(inPacked, b.CreateExtractElement(value, static_cast<uint64_t>(l)), zero),
            stagedValue(t, xPerThread + 4 * i + l));
    }
  };
  auto stage = [&](llvm::Value* t) {
    llvm::Value* u = inGroup(t);
    llvm::Value* xs = groupShared(t);
    llvm::Value* ws = b.CreateConstGEP1_64(f32, xs, static_cast<uint64_t>(chunk * xStride));
    for (int64_t i = 0; i < xPerThread; ++i) {
      auto [e, inside] = element(u, i, xElements);
      auto store = [&, e = e] {
        llvm::Value* at =
            b.CreateAdd(b.CreateMul(b.CreateURem(e, constant(chunk)), constant(xStride)),
                        b.CreateUDiv(e, constant(chunk)));
        b.CreateAlignedStore(b.CreateLoad(f32, stagedValue(t, i)), b.CreateGEP(f32, xs, at),
                             llvm::Align(4));
      };
      if (inside)
        ifThen(inside, "stage_x", store);
      else
        store();
    }
    for (int64_t i = 0; i < quadsPerThread; ++i) {
      auto [q, inside] = element(u, i, quads);
      auto store = [&, q = q] {
        llvm::Value* value = llvm::PoisonValue::get(quad);
        for (int64_t l = 0; l < 4; ++l)
          value = b.CreateInsertElement(value,
                                        b.CreateLoad(f32, stagedValue(t, xPerThread + 4 * i + l)),
                                        static_cast<uint64_t>(l));
        // Packed depth q * 4 / wPerDepth, column q * 4 % wPerDepth, at its stride.
        llvm::Value* at = b.CreateMul(q, constant(4));
        if (wStride != wPerDepth)
          at = b.CreateAdd(b.CreateMul(b.CreateUDiv(at, constant(wPerDepth)), constant(wStride)),
                           b.CreateURem(at, constant(wPerDepth)));
        b.CreateAlignedStore(value, b.CreateGEP(f32, ws, at), llvm::Align(16));
      };
      if (inside)
        ifThen(inside, "stage_w", store);
      else
        store();
    }
  };
  // A run of n floats from shared memory, in vector loads where they are whole aligned fours.
  auto loadRun = [&](llvm::Value* base, int64_t n) {
    std::vector<llvm::Value*> values;
    for (int64_t i = 0; i < n;) {
      const int64_t width = (n % 4 == 0) ? 4 : 1;
      llvm::Value* p = b.CreateConstGEP1_64(f32, base, static_cast<uint64_t>(i));
      if (width == 4) {
        llvm::Value* v = b.CreateAlignedLoad(quad, p, llvm::Align(16));
        for (int64_t l = 0; l < 4; ++l)
          values.push_back(b.CreateExtractElement(v, static_cast<uint64_t>(l)));
      } else {
        values.push_back(b.CreateAlignedLoad(f32, p, llvm::Align(4)));
      }
      i += width;
    }
    return values;
  };

  // Tensor cores: warp w of a group takes warpTileRows x warpTileColumns MMA tiles of 16 rows
  // by 8 packed columns; lane 4g + l holds, of each, the sums of rows g and g + 8 at packed
  // columns 2l and 2l + 1 (PTX's m16n8k8 fragment layout), accumulator (tile * 4 + r) that of
  // row g + 8 * (r / 2), column 2l + r % 2.
  const int64_t warpsAcross = tensor ? packed.width * slices / 8 / packed.warpTileColumns : 1;
  struct Lane {
    llvm::Value *rowBase, *columnBase, *g, *l;
  };
  auto laneOf = [&](llvm::Value* t) {
    llvm::Value* u = inGroup(t);
    llvm::Value* warp = b.CreateUDiv(u, constant(kGpuWarpLanes));
    llvm::Value* lane = b.CreateURem(u, constant(kGpuWarpLanes));
    return Lane{
        b.CreateMul(b.CreateUDiv(warp, constant(warpsAcross)), constant(16 * packed.warpTileRows)),
        b.CreateMul(b.CreateURem(warp, constant(warpsAcross)),
                    constant(8 * packed.warpTileColumns)),
        b.CreateUDiv(lane, constant(4)), b.CreateURem(lane, constant(4))};
  };
  // Where accumulator a of a lane sits in its group's tile: its row and packed column.
  auto accumulatorAt = [&](const Lane& lane, int64_t a) {
    const int64_t tileIndex = a / 4, r = a % 4;
    const int64_t down = tileIndex / packed.warpTileColumns;
    const int64_t across = tileIndex % packed.warpTileColumns;
    return std::pair<llvm::Value*, llvm::Value*>{
        b.CreateAdd(lane.rowBase, b.CreateAdd(lane.g, constant(16 * down + 8 * (r / 2)))),
        b.CreateAdd(lane.columnBase,
                    b.CreateAdd(b.CreateMul(lane.l, constant(2)), constant(8 * across + r % 2)))};
  };
  auto accumulateOnTensorCores = [&](llvm::Value* t) {
    llvm::Value* xs = groupShared(t);
    llvm::Value* ws = b.CreateConstGEP1_64(f32, xs, static_cast<uint64_t>(chunk * xStride));
    const Lane lane = laneOf(t);
    // x at (row, depth k) and the weight at (depth k, packed column), from the group's chunk.
    auto xAt = [&](llvm::Value* row, llvm::Value* k) {
      return b.CreateAlignedLoad(
          f32, b.CreateGEP(f32, xs, b.CreateAdd(b.CreateMul(k, constant(xStride)), row)),
          llvm::Align(4));
    };
    auto wAt = [&](llvm::Value* column, llvm::Value* k) {
      return b.CreateAlignedLoad(
          f32, b.CreateGEP(f32, ws, b.CreateAdd(b.CreateMul(k, constant(wStride)), column)),
          llvm::Align(4));
    };
    if (emulated) {
      // Each of the lane's sums over the chunk's depths, one after the other: what the MMAs
      // compute (in fp32, which 3xTF32 keeps to within a few ulps).
      for (int64_t a = 0; a < accumulators; ++a) {
        auto [row, column] = accumulatorAt(lane, a);
        llvm::Value* sum = b.CreateLoad(f32, accumulator(t, a));
        for (int64_t k = 0; k < chunk; ++k)
          sum = fmuladd(xAt(row, constant(k)), wAt(column, constant(k)), sum);
        b.CreateStore(sum, accumulator(t, a));
      }
      return;
    }
    // A float as the sum of two TF32s (big + small, each rounded to nearest), which the MMAs
    // take as 32-bit integers.
    auto split = [&](llvm::Value* value) {
      llvm::Value* big = b.CreateIntrinsic(llvm::Intrinsic::nvvm_f2tf32_rna, {}, {value});
      llvm::Value* rest = b.CreateFSub(value, b.CreateBitCast(big, f32));
      llvm::Value* small = b.CreateIntrinsic(llvm::Intrinsic::nvvm_f2tf32_rna, {}, {rest});
      return std::pair<llvm::Value*, llvm::Value*>{big, small};
    };
    std::vector<llvm::Value*> acc;
    for (int64_t a = 0; a < accumulators; ++a)
      acc.push_back(b.CreateLoad(f32, accumulator(t, a)));
    for (int64_t k8 = 0; k8 < chunk; k8 += 8) {
      // A (16 x 8, rows by depths): a0 (g, l), a1 (g + 8, l), a2 (g, l + 4), a3 (g + 8, l + 4).
      std::vector<std::array<std::pair<llvm::Value*, llvm::Value*>, 4>> as;
      for (int64_t down = 0; down < packed.warpTileRows; ++down) {
        std::array<std::pair<llvm::Value*, llvm::Value*>, 4> fragment;
        for (int64_t r = 0; r < 4; ++r) {
          llvm::Value* row =
              b.CreateAdd(lane.rowBase, b.CreateAdd(lane.g, constant(16 * down + 8 * (r % 2))));
          llvm::Value* k = b.CreateAdd(lane.l, constant(k8 + 4 * (r / 2)));
          fragment[static_cast<size_t>(r)] = split(xAt(row, k));
        }
        as.push_back(fragment);
      }
      // B (8 x 8, depths by packed columns): b0 (l, g), b1 (l + 4, g).
      std::vector<std::array<std::pair<llvm::Value*, llvm::Value*>, 2>> bs;
      for (int64_t across = 0; across < packed.warpTileColumns; ++across) {
        std::array<std::pair<llvm::Value*, llvm::Value*>, 2> fragment;
        for (int64_t r = 0; r < 2; ++r) {
          llvm::Value* column =
              b.CreateAdd(lane.columnBase, b.CreateAdd(lane.g, constant(8 * across)));
          llvm::Value* k = b.CreateAdd(lane.l, constant(k8 + 4 * r));
          fragment[static_cast<size_t>(r)] = split(wAt(column, k));
        }
        bs.push_back(fragment);
      }
      for (int64_t down = 0; down < packed.warpTileRows; ++down)
        for (int64_t across = 0; across < packed.warpTileColumns; ++across) {
          const auto& fa = as[static_cast<size_t>(down)];
          const auto& fb = bs[static_cast<size_t>(across)];
          const size_t first = static_cast<size_t>((down * packed.warpTileColumns + across) * 4);
          // The small products first, the big one last: 3xTF32.
          auto mma = [&](bool aBig, bool bBig) {
            std::vector<llvm::Value*> operands;
            for (const auto& part : fa)
              operands.push_back(aBig ? part.first : part.second);
            for (const auto& part : fb)
              operands.push_back(bBig ? part.first : part.second);
            for (size_t r = 0; r < 4; ++r)
              operands.push_back(acc[first + r]);
            llvm::Value* d =
                b.CreateIntrinsic(llvm::Intrinsic::nvvm_mma_m16n8k8_row_col_tf32, {}, operands);
            for (unsigned r = 0; r < 4; ++r)
              acc[first + r] = b.CreateExtractValue(d, {r});
          };
          mma(false, true);
          mma(true, false);
          mma(true, true);
        }
    }
    for (int64_t a = 0; a < accumulators; ++a)
      b.CreateStore(acc[static_cast<size_t>(a)], accumulator(t, a));
  };

  eachThread("fetch", [&](llvm::Value* t) { fetch(t, chunkStart(t, constant(0))); });
  forLoop(constant(0), constant(groupChunks), constant(1), "chunk", [&](llvm::Value* i) {
    eachThread("stage", stage);
    barrier();
    // Accumulate: at each depth of the chunk, the thread's rows and its weights from its
    // group's shared memory, their products into the sums.
    eachThread("accumulate", [&](llvm::Value* t) {
      llvm::Value* next = b.CreateAdd(i, constant(1));
      ifThen(b.CreateICmpULT(next, constant(groupChunks)), "fetch_next",
             [&] { fetch(t, chunkStart(t, next)); });
      if (tensor)
        return accumulateOnTensorCores(t);
      llvm::Value* u = inGroup(t);
      llvm::Value* xs = groupShared(t);
      llvm::Value* ws = b.CreateConstGEP1_64(f32, xs, static_cast<uint64_t>(chunk * xStride));
      llvm::Value* rowBase = b.CreateMul(b.CreateUDiv(u, constant(columnGroups)), constant(tm));
      llvm::Value* columnGroup = b.CreateURem(u, constant(columnGroups));
      std::vector<llvm::Value*> acc;
      for (int64_t a = 0; a < sums; ++a)
        acc.push_back(b.CreateLoad(f32, accumulator(t, a)));
      for (int64_t kk = 0; kk < chunk; ++kk) {
        std::vector<llvm::Value*> xv =
            loadRun(b.CreateGEP(f32, xs, b.CreateAdd(rowBase, constant(kk * xStride))), tm);
        std::vector<llvm::Value*> wv;
        for (int64_t piece = 0; piece < tn / pieceColumns; ++piece) {
          llvm::Value* at = b.CreateAdd(
              b.CreateMul(threadColumn(columnGroup, piece * pieceColumns), constant(slices)),
              constant(kk * wPerDepth));
          for (llvm::Value* w : loadRun(b.CreateGEP(f32, ws, at), pieceColumns * slices))
            wv.push_back(w);
        }
        for (int64_t m = 0; m < tm; ++m)
          for (int64_t c = 0; c < tn; ++c)
            for (int64_t s2 = 0; s2 < slices; ++s2) {
              auto a = static_cast<size_t>(sumIndex(m, c, s2));
              acc[a] = fmuladd(xv[static_cast<size_t>(m)], wv[static_cast<size_t>(c * slices + s2)],
                               acc[a]);
            }
      }
      for (int64_t a = 0; a < sums; ++a)
        b.CreateStore(acc[static_cast<size_t>(a)], accumulator(t, a));
    });
    barrier();
  });
  if (tensor) {
    // Every lane's sums to shared memory, [group][row][packed column] (the staging is done
    // with: the loop ended at a barrier); then thread t of the block finishes elements t,
    // t + threads, ... of the tile, row by row, each adding its slices' sums over the groups.
    const int64_t sumStride = packed.sharedSumStride(), groupSums = packed.tileRows * sumStride;
    eachThread("gather", [&](llvm::Value* t) {
      const Lane lane = laneOf(t);
      llvm::Value* to = b.CreateGEP(f32, shared, b.CreateMul(groupOf(t), constant(groupSums)));
      for (int64_t a = 0; a < accumulators; ++a) {
        auto [row, column] = accumulatorAt(lane, a);
        b.CreateAlignedStore(
            b.CreateLoad(f32, accumulator(t, a)),
            b.CreateGEP(f32, to, b.CreateAdd(b.CreateMul(row, constant(sumStride)), column)),
            llvm::Align(4));
      }
    });
    barrier();
    const int64_t elements = packed.tileRows * packed.width;
    eachThread("finish", [&](llvm::Value* t) {
      for (int64_t i = 0; i < (elements + threads - 1) / threads; ++i) {
        llvm::Value* e = b.CreateAdd(t, constant(i * threads));
        llvm::Value* rowInTile = b.CreateUDiv(e, constant(packed.width));
        llvm::Value* columnInTile = b.CreateURem(e, constant(packed.width));
        llvm::Value* r = b.CreateAdd(firstRow, rowInTile);
        llvm::Value* j = b.CreateAdd(firstColumn, columnInTile);
        llvm::Value* inside =
            b.CreateAnd(b.CreateICmpULT(r, rows), b.CreateICmpULT(j, constant(packed.columns)));
        if ((i + 1) * threads > elements)
          inside = b.CreateAnd(inside, b.CreateICmpULT(e, constant(elements)));
        ifThen(inside, "element", [&] {
          llvm::Value* at = b.CreateAdd(b.CreateMul(rowInTile, constant(sumStride)),
                                        b.CreateMul(columnInTile, constant(slices)));
          std::vector<llvm::Value*> sliceSums;
          for (int64_t s2 = 0; s2 < slices; ++s2) {
            llvm::Value* total = nullptr;
            for (int64_t other = 0; other < groups; ++other) {
              llvm::Value* part = b.CreateAlignedLoad(
                  f32, b.CreateGEP(f32, shared, b.CreateAdd(at, constant(other * groupSums + s2))),
                  llvm::Align(4));
              total = total ? b.CreateFAdd(total, part) : part;
            }
            sliceSums.push_back(total);
          }
          finishElement(region, tile, r, j, sliceSums);
        });
      }
    });
    // The next tile's staging overwrites the sums.
    barrier();
    return;
  }
  // Several groups: every thread's sums to shared memory, [group][thread of group][sum] (the
  // staging is done with: the loop ended at a barrier), and the sums of element e of thread u's
  // of every group added up by group e % groups.
  if (groups > 1) {
    eachThread("gather", [&](llvm::Value* t) {
      llvm::Value* to = b.CreateGEP(f32, shared, b.CreateMul(t, constant(sums)));
      for (int64_t a = 0; a < sums; ++a)
        b.CreateStore(b.CreateLoad(f32, accumulator(t, a)),
                      b.CreateConstGEP1_64(f32, to, static_cast<uint64_t>(a)));
    });
    barrier();
  }
  // The thread's elements inside the product: the kernel's work on their sums.
  eachThread("finish", [&](llvm::Value* t) {
    llvm::Value* u = inGroup(t);
    llvm::Value* g = groupOf(t);
    llvm::Value* rowBase =
        b.CreateAdd(firstRow, b.CreateMul(b.CreateUDiv(u, constant(columnGroups)), constant(tm)));
    llvm::Value* columnGroup = b.CreateURem(u, constant(columnGroups));
    for (int64_t m = 0; m < tm; ++m)
      for (int64_t c = 0; c < tn; ++c) {
        llvm::Value* r = b.CreateAdd(rowBase, constant(m));
        llvm::Value* j = b.CreateAdd(firstColumn, threadColumn(columnGroup, c));
        llvm::Value* inside =
            b.CreateAnd(b.CreateICmpULT(r, rows), b.CreateICmpULT(j, constant(packed.columns)));
        if (groups > 1)
          inside = b.CreateAnd(inside, b.CreateICmpEQ(g, constant((m * tn + c) % groups)));
        ifThen(inside, "element", [&] {
          std::vector<llvm::Value*> sliceSums;
          for (int64_t s2 = 0; s2 < slices; ++s2) {
            llvm::Value* total = nullptr;
            if (groups == 1) {
              total = b.CreateLoad(f32, accumulator(t, sumIndex(m, c, s2)));
            } else {
              for (int64_t other = 0; other < groups; ++other) {
                llvm::Value* at = b.CreateAdd(
                    b.CreateMul(b.CreateAdd(constant(other * groupThreads), u), constant(sums)),
                    constant(sumIndex(m, c, s2)));
                llvm::Value* part =
                    b.CreateAlignedLoad(f32, b.CreateGEP(f32, shared, at), llvm::Align(4));
                total = total ? b.CreateFAdd(total, part) : part;
              }
            }
            sliceSums.push_back(total);
          }
          finishElement(region, tile, r, j, sliceSums);
        });
      }
  });
  // The next tile's staging overwrites what the finish read.
  if (groups > 1)
    barrier();
}

llvm::Value* GpuEmitter::warpSum(llvm::Value* value) {
  llvm::Type* i32 = llvm::Type::getInt32Ty(llvmContext);
  for (int offset = kGpuWarpLanes / 2; offset >= 1; offset /= 2)
    value = b.CreateFAdd(value, b.CreateIntrinsic(llvm::Intrinsic::nvvm_shfl_sync_bfly_f32, {},
                                                  {llvm::ConstantInt::get(i32, 0xffffffffu), value,
                                                   llvm::ConstantInt::get(i32, offset),
                                                   llvm::ConstantInt::get(i32, 0x1f)}));
  return value;
}

// Item (row tile, column j) on a warp (PackedProduct::splitDepth): lane l sums the tile's rows
// of x times column j of every slice over depths l, l + 32, ... (the warp's 32 weights and 32
// inputs at a time are each one 128-byte load), the lanes' parts are summed by shuffles, and
// lane m finishes row m of the tile (the kernel's elementwise work; standalone: the sum
// stored), so that the tile's rows run side by side rather than one lane doing all of them.
// Emulated (no lane_), one thread runs an item's lanes one after the other into the same sums.
void GpuEmitter::emitSplitDepthProduct(const GpuRegion& region, llvm::Value* item,
                                       llvm::Value* rows) {
  const PackedProduct& packed = *region.packed;
  const int64_t slices = packed.slices(), tileRows = packed.tileRows, depth = packed.depth;
  const ProductTile tile = startProduct(region, item, rows);
  const std::vector<llvm::AllocaInst*>& sums = tile.sums;
  llvm::Value* weights =
      b.CreateGEP(f32, buffers[packed.buffer], b.CreateMul(tile.j, constant(slices * depth)));
  llvm::Value* firstLane = lane_ ? lane_ : constant(0);
  llvm::Value* endLane = lane_ ? b.CreateAdd(lane_, constant(1)) : constant(kGpuWarpLanes);
  forLoop(firstLane, endLane, constant(1), "lane", [&](llvm::Value* l) {
    accumulate(sums, tile.x, tile.rows, slices, l, depth, kGpuWarpLanes,
               [&](llvm::Value* k, int64_t s) {
                 return b.CreateGEP(f32, weights, b.CreateAdd(k, constant(s * depth)));
               });
  });
  if (lane_)
    for (llvm::AllocaInst* acc : sums)
      b.CreateStore(warpSum(b.CreateLoad(f32, acc)), acc);
  // Lane m < tileRows finishes row m (emulated: rows 0..tileRows-1 in turn).
  llvm::Value* firstTileRow = lane_ ? lane_ : constant(0);
  llvm::Value* endTileRow = lane_ ? b.CreateSelect(b.CreateICmpULT(lane_, constant(tileRows)),
                                                   b.CreateAdd(lane_, constant(1)), lane_)
                                  : constant(tileRows);
  forLoop(firstTileRow, endTileRow, constant(1), "tile_row", [&](llvm::Value* m) {
    llvm::Value* r = b.CreateAdd(tile.firstRow, m);
    // Row m's sums, chosen without indexing the accumulators (which would put them in memory).
    std::vector<llvm::Value*> rowSums;
    for (int64_t s = 0; s < slices; ++s) {
      llvm::Value* chosen = b.CreateLoad(f32, sums[static_cast<size_t>(s)]);
      for (int64_t other = 1; other < tileRows; ++other)
        chosen = b.CreateSelect(b.CreateICmpEQ(m, constant(other)),
                                b.CreateLoad(f32, sums[static_cast<size_t>(other * slices + s)]),
                                chosen);
      rowSums.push_back(chosen);
    }
    ifThen(b.CreateICmpULT(r, rows), "row_in_tile",
           [&] { finishElement(region, tile, r, tile.j, rowSums); });
  });
}

// Block tiles (PackedProduct::blockTiled): see there. Split depth (PackedProduct::splitDepth),
// item (column, depth k): packed[column][s][k] = W(offset_s + column, k) for every slice s,
// zero past the kernel's columns.
void GpuEmitter::emitPacking(const PackedProduct& packed, llvm::Value* item) {
  const ir::Instr& product = *packed.product;
  const View w = view(product.operands[1]);
  const bool linear = product.op == Op::Linear; // W [N, K]; a matmul's is [K, N]
  llvm::Value* width = constant(packed.width);
  llvm::Value* k = nullptr;
  llvm::Value* column = nullptr;
  llvm::Value* to = nullptr;
  int64_t sliceStride = 1; // floats from one slice's weight to the next's
  if (packed.blockTiled) {
    // Item (block, packed depth k, column c of the block): packed[blk][k][c][s], zero past the
    // depth too (a whole number of chunks).
    llvm::Value* c = b.CreateURem(item, width);
    llvm::Value* blockDepth = b.CreateUDiv(item, width); // blk * packedDepth + k
    k = b.CreateURem(blockDepth, constant(packed.packedDepth()));
    column = b.CreateAdd(
        b.CreateMul(b.CreateUDiv(blockDepth, constant(packed.packedDepth())), width), c);
    to = b.CreateGEP(f32, buffers[packed.buffer], b.CreateMul(item, constant(packed.slices())));
  } else { // split depth
    k = b.CreateURem(item, constant(packed.depth));
    column = b.CreateUDiv(item, constant(packed.depth));
    to = b.CreateGEP(f32, buffers[packed.buffer],
                     b.CreateAdd(b.CreateMul(column, constant(packed.slices() * packed.depth)), k));
    sliceStride = packed.depth;
  }
  llvm::Value* inside = b.CreateICmpULT(column, constant(packed.columns));
  if (packed.blockTiled) {
    llvm::Value* inDepth = b.CreateICmpULT(k, constant(packed.depth));
    inside = b.CreateAnd(inside, inDepth);
    k = b.CreateSelect(inDepth, k, constant(packed.depth - 1));
  }
  llvm::Value* clamped = b.CreateSelect(b.CreateICmpULT(column, constant(packed.columns)), column,
                                        constant(packed.columns - 1));
  for (int64_t s = 0; s < packed.slices(); ++s) {
    llvm::Value* n = b.CreateAdd(clamped, constant(packed.offsets[static_cast<size_t>(s)]));
    llvm::Value* weight = linear ? load(w, n, k) : load(w, k, n);
    b.CreateAlignedStore(b.CreateSelect(inside, weight, llvm::ConstantFP::get(f32, 0.0)),
                         b.CreateConstGEP1_64(f32, to, static_cast<uint64_t>(s * sliceStride)),
                         llvm::Align(4));
  }
}

void GpuEmitter::emitInstruction(const ir::Instr& instr, llvm::Value* item) {
  const View out = view(&instr.result);
  switch (instr.op) {
  case Op::Linear:
  case Op::MatMul: { // item (r, n): a dot product over the depth
    const ir::Value* x = instr.operands[0];
    const View a = view(x), w = view(instr.operands[1]);
    llvm::Value* n = constant(columnsOf(&instr.result));
    llvm::Value* r = b.CreateUDiv(item, n);
    llvm::Value* col = b.CreateURem(item, n);
    llvm::AllocaInst* acc = slot("dot");
    b.CreateStore(llvm::ConstantFP::get(f32, 0.0), acc);
    forLoop(constant(0), constant(columnsOf(x)), constant(1), "depth", [&](llvm::Value* k) {
      llvm::Value* weight = instr.op == Op::Linear ? load(w, col, k) : load(w, k, col);
      b.CreateStore(fmuladd(load(a, r, k), weight, b.CreateLoad(f32, acc)), acc);
    });
    store(b.CreateLoad(f32, acc), out, r, col);
    return;
  }
  case Op::LayerNorm:
  case Op::LayerNormGrad: { // item r: a row, in two passes as the CPU's
    const ir::Value* x = instr.operands[0];
    const View in = view(x);
    const int64_t cols = columnsOf(x);
    llvm::Value* count = llvm::ConstantFP::get(f32, static_cast<double>(cols));
    llvm::Value* r = item;
    llvm::Value* mean =
        b.CreateFDiv(sum(cols, [&](llvm::Value* j) { return load(in, r, j); }), count);
    llvm::Value* variance = b.CreateFDiv(sum(cols,
                                             [&](llvm::Value* j) {
                                               llvm::Value* d = b.CreateFSub(load(in, r, j), mean);
                                               return b.CreateFMul(d, d);
                                             }),
                                         count);
    llvm::Value* spread =
        b.CreateIntrinsic(llvm::Intrinsic::sqrt, {f32},
                          {b.CreateFAdd(variance, llvm::ConstantFP::get(f32, instr.attrs.value))});
    llvm::Value* inverse = b.CreateFDiv(llvm::ConstantFP::get(f32, 1.0), spread);
    auto normalised = [&](llvm::Value* j) {
      return b.CreateFMul(b.CreateFSub(load(in, r, j), mean), inverse);
    };
    if (instr.op == Op::LayerNorm) {
      forLoop(constant(0), constant(cols), constant(1), "col",
              [&](llvm::Value* j) { store(normalised(j), out, r, j); });
      return;
    }
    // dx = (g - mean(g) - y mean(g y)) / sqrt(var + eps), y = layernorm(x)
    const View g = view(instr.operands[1]);
    llvm::Value* gMean =
        b.CreateFDiv(sum(cols, [&](llvm::Value* j) { return load(g, r, j); }), count);
    llvm::Value* gyMean = b.CreateFDiv(
        sum(cols, [&](llvm::Value* j) { return b.CreateFMul(load(g, r, j), normalised(j)); }),
        count);
    forLoop(constant(0), constant(cols), constant(1), "col", [&](llvm::Value* j) {
      llvm::Value* centred =
          b.CreateFSub(b.CreateFSub(load(g, r, j), gMean), b.CreateFMul(normalised(j), gyMean));
      store(b.CreateFMul(centred, inverse), out, r, j);
    });
    return;
  }
  case Op::Concat:
  case Op::Stack: { // item (r, c): from the part that holds it
    llvm::Value* cols = constant(columnsOf(&instr.result));
    llvm::Value* r = b.CreateUDiv(item, cols);
    llvm::Value* c = b.CreateURem(item, cols);
    int64_t at = 0;
    for (const ir::Value* part : instr.operands) {
      const int64_t extent = instr.op == Op::Concat ? columnsOf(part) : fixedRowsOf(part);
      llvm::Value* index = instr.op == Op::Concat ? c : r;
      llvm::Value* within = b.CreateAnd(b.CreateICmpSGE(index, constant(at)),
                                        b.CreateICmpSLT(index, constant(at + extent)));
      const View from = view(part);
      ifThen(within, "part", [&] {
        llvm::Value* local = b.CreateSub(index, constant(at));
        store(instr.op == Op::Concat ? load(from, r, local) : load(from, local, c), out, r, c);
      });
      at += extent;
    }
    return;
  }
  // Elementwise ops run in kernels (KernelEmitter), slices and constants are views.
  case Op::Const:
  case Op::Slice:
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
  case Op::DropoutMask: // refused by planGpuRegions
    break;
  }
  RNNC_INTERNAL_CHECK(false, "no GPU code for " + std::string(ir::opName(instr.op)));
}

// Item (r, c) of the copies that end a step, or of the final states (CellEmitter::emitStep).
void GpuEmitter::emitStepEnd(const GpuRegion& region, llvm::Value* item) {
  llvm::Value* width = constant(region.itemsPerRow);
  llvm::Value* r = b.CreateUDiv(item, width);
  llvm::Value* c = b.CreateURem(item, width);
  auto copy = [&](const View& to, const View& from, int64_t cols) {
    ifThen(b.CreateICmpSLT(c, constant(cols)), "copy", [&] { store(load(from, r, c), to, r, c); });
  };
  const int64_t outCols = columnsOf(cell.output);
  if (region.kind == Kind::FinalStates) {
    llvm::Value* lastRow = b.CreateMul(b.CreateSub(steps, constant(1)), batch);
    View last{b.CreateGEP(f32, output, b.CreateMul(lastRow, constant(outCols))), constant(outCols)};
    ifThen(b.CreateICmpSGT(steps, constant(0)), "final_state", [&] {
      for (size_t i = 0; i < cell.updates.size(); ++i)
        if (plan.readFromOutput[i]) {
          const View from{b.CreateConstGEP1_64(f32, last.base,
                                               static_cast<uint64_t>(plan.readFromOutputColumn[i])),
                          last.rowStride};
          const int64_t cols = columnsOf(cell.states[i].get());
          copy({states[i], constant(cols)}, from, cols);
        }
    });
    return;
  }
  if (region.kind == Kind::StepOutputs && !plan.outputInPlace)
    copy(outputRows_, view(cell.output), outCols);
  for (size_t i = 0; i < cell.updates.size(); ++i) {
    const ir::Value* next = cell.updates[i].next;
    const int64_t cols = columnsOf(next);
    if (plan.updatedInKernel[i])
      continue;
    const View staged = plan.staging[i] >= 0
                            ? View{buffers[static_cast<size_t>(plan.staging[i])], constant(cols)}
                            : View{};
    if (region.kind == Kind::StepOutputs && plan.staging[i] >= 0)
      copy(staged, view(next), cols);
    if (region.kind == Kind::StepStates && next != cell.updates[i].state && !plan.readFromOutput[i])
      copy(views.at(cell.states[i].get()), plan.staging[i] >= 0 ? staged : view(next), cols);
  }
}

llvm::Value* GpuEmitter::specialRegister(llvm::Intrinsic::ID id) {
  return b.CreateZExt(b.CreateIntrinsic(id, {}, {}), i64);
}

// Every block of the grid waits here until all have arrived, for the `generation`th time since
// the counter was zeroed: __syncthreads, then one thread per block adds one to the counter and
// spins until it reaches generation * blocks, then __syncthreads. The fences order the region's
// writes before the arrival and the next region's reads after it. Needs every block resident at
// once (the runtime sizes the grid so, from the occupancy the driver reports).
void GpuEmitter::gridBarrier(llvm::Value* counter, llvm::Value* generation) {
  b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
  llvm::Value* first =
      b.CreateICmpEQ(specialRegister(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x), constant(0));
  ifThen(first, "arrive", [&] {
    b.CreateIntrinsic(llvm::Intrinsic::nvvm_membar_gl, {}, {}); // __threadfence()
    b.CreateAtomicRMW(llvm::AtomicRMWInst::Add, counter, constant(1), llvm::MaybeAlign(8),
                      llvm::AtomicOrdering::Monotonic);
    llvm::Value* target =
        b.CreateMul(generation, specialRegister(llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x));
    auto* spin = llvm::BasicBlock::Create(llvmContext, "spin", fn);
    auto* arrivedAll = llvm::BasicBlock::Create(llvmContext, "arrived_all", fn);
    b.CreateBr(spin);
    b.SetInsertPoint(spin);
    llvm::LoadInst* arrived = b.CreateAlignedLoad(i64, counter, llvm::Align(8), "arrived");
    arrived->setVolatile(true);
    b.CreateCondBr(b.CreateICmpULT(arrived, target), spin, arrivedAll);
    b.SetInsertPoint(arrivedAll);
    b.CreateIntrinsic(llvm::Intrinsic::nvvm_membar_gl, {}, {}); // __threadfence()
  });
  b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
}

void GpuEmitter::emitKernels(const std::vector<llvm::Function*>& regionFunctions) {
  llvm::NamedMDNode* annotations = module->getOrInsertNamedMetadata("nvvm.annotations");
  llvm::Type* i32 = llvm::Type::getInt32Ty(llvmContext);
  auto kernel = [&](const std::string& name, std::vector<llvm::Type*> parameters) {
    auto* type = llvm::FunctionType::get(llvm::Type::getVoidTy(llvmContext), parameters, false);
    fn = llvm::Function::Create(type, llvm::Function::ExternalLinkage, name, *module);
    fn->addFnAttr("target-cpu", target.cpu);
    fn->addFnAttr("target-features", target.features);
    fn->addFnAttr(llvm::Attribute::NoUnwind);
    annotations->addOperand(llvm::MDNode::get(
        llvmContext, {llvm::ValueAsMetadata::get(fn), llvm::MDString::get(llvmContext, "kernel"),
                      llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(i32, 1))}));
    b.SetInsertPoint(llvm::BasicBlock::Create(llvmContext, "entry", fn));
  };
  // A kernel of block tiles runs in blocks of exactly their threads; two such blocks to a
  // multiprocessor, so that each keeps to 128 registers a thread (ptxas gave the input
  // projection's tile 131 on an H200, one block of 8 warps a multiprocessor to hide its
  // latencies) and the persistent kernel can have twice as many blocks resident.
  auto launchBounds = [&](int64_t blockThreads) {
    for (auto [key, value] : {std::pair<const char*, int64_t>{"maxntidx", blockThreads},
                              {"minctasm", kGpuBlockTilesPerMultiprocessor}})
      annotations->addOperand(llvm::MDNode::get(
          llvmContext, {llvm::ValueAsMetadata::get(fn), llvm::MDString::get(llvmContext, key),
                        llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(i32, value))}));
  };
  auto globalThread = [&] {
    llvm::Value* blockIndex = specialRegister(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x);
    llvm::Value* blockSize = specialRegister(llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x);
    return b.CreateAdd(b.CreateMul(blockIndex, blockSize),
                       specialRegister(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x));
  };
  auto gridThreads = [&] {
    return b.CreateMul(specialRegister(llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x),
                       specialRegister(llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x));
  };
  // One kernel per region: rnnc_kernel_<i>(args, step).
  for (size_t i = 0; i < regionFunctions.size(); ++i) {
    kernel(kGpuKernelPrefix + std::to_string(i), {ptr, i64});
    if (regions_[i].blockThreads() > 0)
      launchBounds(regions_[i].blockThreads());
    b.CreateCall(regionFunctions[i], {fn->getArg(0), fn->getArg(1), globalThread(), gridThreads()});
    b.CreateRetVoid();
  }
  // The persistent kernel: rnnc_steps(args, counter).
  kernel(kGpuPersistentKernel, {ptr, ptr});
  for (const GpuRegion& region : regions_)
    if (region.phase == GpuPhase::Step && region.blockThreads() > 0) {
      launchBounds(region.blockThreads()); // the persistent kernel's blocks are its tiles'
      break;
    }
  emitPersistentSteps(regionFunctions, fn->getArg(0), fn->getArg(1), globalThread(), gridThreads());
  b.CreateRetVoid();
}

// Every step's regions with a grid barrier after each, as thread `me` of `all`.
void GpuEmitter::emitPersistentSteps(const std::vector<llvm::Function*>& regionFunctions,
                                     llvm::Value* args, llvm::Value* counter, llvm::Value* me,
                                     llvm::Value* all) {
  loadArguments(args);
  std::vector<size_t> stepRegions;
  for (size_t i = 0; i < regions_.size(); ++i)
    if (regions_[i].phase == GpuPhase::Step)
      stepRegions.push_back(i);
  const int64_t perStep = static_cast<int64_t>(stepRegions.size());
  forLoop(constant(0), steps, constant(1), "step", [&](llvm::Value* t) {
    for (int64_t k = 0; k < perStep; ++k) {
      b.CreateCall(regionFunctions[stepRegions[static_cast<size_t>(k)]], {args, t, me, all});
      llvm::Value* generation = b.CreateAdd(b.CreateMul(t, constant(perStep)), constant(k + 1));
      if (target.isGpu())
        gridBarrier(counter, generation);
      else
        hostBarrier(counter, generation, all);
    }
  });
}

// The grid barrier of the emulated persistent kernel, whose blocks are the host's threads of
// one GPU thread each: the same counter and generations as gridBarrier, in C++'s atomics.
void GpuEmitter::hostBarrier(llvm::Value* counter, llvm::Value* generation, llvm::Value* blocks) {
  b.CreateAtomicRMW(llvm::AtomicRMWInst::Add, counter, constant(1), llvm::MaybeAlign(8),
                    llvm::AtomicOrdering::SequentiallyConsistent);
  llvm::Value* target = b.CreateMul(generation, blocks);
  auto* spin = llvm::BasicBlock::Create(llvmContext, "spin", fn);
  auto* arrivedAll = llvm::BasicBlock::Create(llvmContext, "arrived_all", fn);
  b.CreateBr(spin);
  b.SetInsertPoint(spin);
  llvm::LoadInst* arrived = b.CreateAlignedLoad(i64, counter, llvm::Align(8), "arrived");
  arrived->setAtomic(llvm::AtomicOrdering::Acquire);
  b.CreateCondBr(b.CreateICmpULT(arrived, target), spin, arrivedAll);
  b.SetInsertPoint(arrivedAll);
}

void GpuEmitter::emitEmulation(const std::vector<llvm::Function*>& regionFunctions) {
  // rnnc_emulate(args, region, step, threads, reversed)
  auto* type =
      llvm::FunctionType::get(llvm::Type::getVoidTy(llvmContext), {ptr, i64, i64, i64, i64}, false);
  fn = llvm::Function::Create(type, llvm::Function::ExternalLinkage, kGpuEmulateFunction, *module);
  fn->addFnAttr("target-cpu", target.cpu);
  fn->addFnAttr("target-features", target.features);
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  b.SetInsertPoint(llvm::BasicBlock::Create(llvmContext, "entry", fn));
  auto* done = llvm::BasicBlock::Create(llvmContext, "done", fn);
  llvm::SwitchInst* which =
      b.CreateSwitch(fn->getArg(1), done, static_cast<unsigned>(regionFunctions.size()));
  llvm::Value* threadCount = fn->getArg(3);
  for (size_t i = 0; i < regionFunctions.size(); ++i) {
    auto* run = llvm::BasicBlock::Create(llvmContext, "region" + std::to_string(i), fn);
    which->addCase(llvm::ConstantInt::get(llvm::cast<llvm::IntegerType>(i64), i), run);
    b.SetInsertPoint(run);
    // Each thread in turn: forwards, or backwards, so that a thread reading what another wrote
    // in the same region shows as a wrong result in one order or the other.
    forLoop(constant(0), threadCount, constant(1), "thread", [&](llvm::Value* k) {
      llvm::Value* backwards = b.CreateSub(b.CreateSub(threadCount, constant(1)), k);
      llvm::Value* thread =
          b.CreateSelect(b.CreateICmpNE(fn->getArg(4), constant(0)), backwards, k);
      b.CreateCall(regionFunctions[i], {fn->getArg(0), fn->getArg(2), thread, threadCount});
    });
    b.CreateBr(done);
  }
  // Region -1: the persistent kernel's steps as block `step` of `threads` blocks of one thread,
  // each on a host thread of its own, meeting at the grid barrier on the counter at args->team.
  auto* persistent = llvm::BasicBlock::Create(llvmContext, "persistent", fn);
  which->addCase(llvm::ConstantInt::getSigned(llvm::cast<llvm::IntegerType>(i64), -1), persistent);
  b.SetInsertPoint(persistent);
  llvm::Value* counter =
      b.CreateLoad(ptr, b.CreateConstGEP1_64(llvm::Type::getInt8Ty(llvmContext), fn->getArg(0),
                                             offsetof(RnncRunArgs, team)));
  emitPersistentSteps(regionFunctions, fn->getArg(0), counter, fn->getArg(2), threadCount);
  b.CreateBr(done);
  b.SetInsertPoint(done);
  b.CreateRetVoid();
}

} // namespace

std::unique_ptr<llvm::Module> emitGpuCell(llvm::LLVMContext& context, const ir::Cell& cell,
                                          const StoragePlan& plan,
                                          const std::vector<GpuRegion>& regions,
                                          const Target& target) {
  return GpuEmitter(context, cell, plan, regions, target).emit();
}

} // namespace rnnc::codegen

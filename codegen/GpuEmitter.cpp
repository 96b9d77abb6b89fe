#include "codegen/GpuEmitter.h"
#include "codegen/GpuRegionEmitter.h"

#include "ir/Error.h"

#include <cstddef>
#include <vector>

#include <llvm/IR/InlineAsm.h>

namespace rnnc::codegen {

using ir::Op;
using Kind = GpuRegion::Kind;

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
// the counter was zeroed: __syncthreads, then one thread per block adds one to the counter with
// release semantics (red.release.gpu) and spins on an acquiring load (ld.acquire.gpu) until it
// reaches generation * blocks, then __syncthreads. The barriers order the block's writes before
// that thread's release and its acquire before the block's next reads, as in CUTLASS's grid
// barrier; no full fence. With a __threadfence (membar.gl, a sequentially consistent fence)
// before the add and after the spin, as cooperative groups' grid sync has, the persistent
// kernel took 4-9% longer at batch 1 on an H200 (session 50, alternating in one run, medians of
// 3 rounds: tanh RNN T=100 H=256 0.367 -> 0.344 ms, LSTM 0.433 -> 0.416, GRU 0.509 -> 0.464;
// 2% at batch 64; fence.acq_rel.gpu in place of membar.gl made no difference). Needs every
// block resident at once (the runtime sizes the grid so, from the occupancy the driver reports).
void GpuEmitter::gridBarrier(llvm::Value* counter, llvm::Value* generation) {
  auto inlinePtx = [&](llvm::Type* result, std::vector<llvm::Value*> operands, const char* text,
                       const char* constraints) {
    std::vector<llvm::Type*> types;
    for (llvm::Value* operand : operands)
      types.push_back(operand->getType());
    auto* type = llvm::FunctionType::get(result, types, false);
    return b.CreateCall(llvm::InlineAsm::get(type, text, constraints, /*hasSideEffects=*/true),
                        operands);
  };
  b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
  llvm::Value* first =
      b.CreateICmpEQ(specialRegister(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x), constant(0));
  ifThen(first, "arrive", [&] {
    inlinePtx(llvm::Type::getVoidTy(llvmContext), {counter, constant(1)},
              "red.release.gpu.add.u64 [$0], $1;", "l,l,~{memory}");
    llvm::Value* target =
        b.CreateMul(generation, specialRegister(llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x));
    auto* spin = llvm::BasicBlock::Create(llvmContext, "spin", fn);
    auto* arrivedAll = llvm::BasicBlock::Create(llvmContext, "arrived_all", fn);
    b.CreateBr(spin);
    b.SetInsertPoint(spin);
    llvm::Value* arrived =
        inlinePtx(i64, {counter}, "ld.acquire.gpu.u64 $0, [$1];", "=l,l,~{memory}");
    b.CreateCondBr(b.CreateICmpULT(arrived, target), spin, arrivedAll);
    b.SetInsertPoint(arrivedAll);
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

std::unique_ptr<llvm::Module> emitGpuCell(llvm::LLVMContext& context, const ir::Cell& cell,
                                          const StoragePlan& plan,
                                          const std::vector<GpuRegion>& regions,
                                          const Target& target) {
  return GpuEmitter(context, cell, plan, regions, target).emit();
}

} // namespace rnnc::codegen

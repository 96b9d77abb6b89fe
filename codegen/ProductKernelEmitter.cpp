// Matrix products in register tiles: weights packed in tile order by the parameter phase, tiles
// accumulated over the depth, then the elementwise work of the kernel the product is fused into
// (passes/FuseMatMul.h) run on each tile, or the tile stored (a standalone product).
#include "codegen/ProductKernelEmitter.h"

#include "codegen/TileRows.h"

#include "ir/Error.h"

#include <algorithm>
#include <map>

namespace rnnc::codegen {

using ir::Op;

namespace {

// Packed weights per 64-byte line: the unit in which a tile asks for the next panel's lines.
// The caller's PanelPrefetch and the walk it calls must count lines alike (a walk's name says
// its count).
int64_t weightsPerLine(const PackedProduct& packed) {
  return 64 / weightTypeBytes(packed.weights);
}

} // namespace

llvm::Type* ProductKernelEmitter::weightElementType(WeightType type) const {
  switch (type) {
  case WeightType::F32:
    return e.f32;
  case WeightType::F16:
    return e.b.getHalfTy();
  case WeightType::BF16:
    return e.b.getInt16Ty(); // bit patterns: widened by a shift, with no bf16 arithmetic
  case WeightType::I8:
    return e.b.getInt32Ty(); // groups of 4 (QuantizedProducts.cpp)
  }
  return e.f32;
}

llvm::Value* ProductKernelEmitter::widenWeights(llvm::Value* packed, WeightType type) {
  // A vector of them, or one (bf16Rows widens a row's last values one by one).
  llvm::Type* floats = packed->getType()->getWithNewType(e.f32);
  switch (type) {
  case WeightType::F32:
    return packed;
  case WeightType::F16:
    return e.b.CreateFPExt(packed, floats); // vcvtph2ps
  case WeightType::BF16: {
    llvm::Type* ints = packed->getType()->getWithNewType(e.b.getInt32Ty());
    llvm::Value* wide = e.b.CreateShl(e.b.CreateZExt(packed, ints), 16); // vpmovzxwd, vpslld
    return e.b.CreateBitCast(wide, floats);
  }
  case WeightType::I8:
    break; // QuantizedProducts.cpp
  }
  RNNC_INTERNAL_CHECK(type != WeightType::I8, "int8 tiles are emitted by emitInt8Tile");
  return packed;
}

// Packs a fused product's weights in tile order (StoragePlan.h, PackedProduct): per block of
// columns, per depth k, each slice's `width` weights side by side; zero past the columns.
void ProductKernelEmitter::emitPacking(const PackedProduct& packed) {
  // The runtime's packer (runtime/exec/WeightPacking.h) on this thread's blocks, told the layout
  // by a constant table: the loops are the same for every cell, and compiling them into each
  // cell's code cost a tenth of the back end's work of a cold compile.
  const std::vector<int64_t> fields = packLayout(packed);
  llvm::Constant* table = llvm::ConstantDataArray::get(e.llvmContext, llvm::ArrayRef(fields));
  auto* layout = new llvm::GlobalVariable(*e.module, table->getType(), true,
                                          llvm::GlobalValue::PrivateLinkage, table, "pack_layout");
  View w = e.view(packed.product->operands[1]);
  llvm::Value* scales = packed.weights == WeightType::I8 ? e.buffers[packed.scaleBuffer]
                                                         : llvm::ConstantPointerNull::get(e.ptr);
  e.synced = false;
  e.b.CreateCall(e.packWeightsFn, {layout, w.base, w.rowStride, e.buffers[packed.buffer], scales,
                                   e.thread, e.threads});
}

// A product computed in tiles (StoragePlan.h, PackedProduct): per chunk of rows, per block of
// `width` columns, per tile of rows, the product's columns of every slice are computed in
// registers, then the kernel's elementwise work runs on them (a standalone product: they are
// stored). Blocks are outside the tiles so that a block's packed weights stay in cache while
// every row of the chunk uses them; chunks (of a row-split product) are outside the blocks so
// that their rows of x stay in L2 while every block passes over them.
void ProductKernelEmitter::emitProductKernel(const ir::Block& block, const KernelGroup* group,
                                             const PackedProduct& packed, llvm::Value* batchRows) {
  const ir::Instr& product = *packed.product;
  const int64_t slices = static_cast<int64_t>(packed.offsets.size());
  const int64_t tileRows = packed.tileRows;
  const std::vector<std::vector<const ir::Value*>> sliceValues =
      sliceValuesOf(block, group, packed);
  // What the epilogue reads per row, as it reads it (prefetchRows asks for each one's lines of
  // the tile's columns): a slice of an operand by the slice's own view, whose columns are the
  // ones read. Asked for by the operand, an LSTM's premultiplied input had only its first gate's
  // lines asked for, and the loads of the other three missed the caches (Intel Xeon, where the
  // LSTM's 4 MB of W_hh evict them from L2 every step: a quarter of the elementwise code's time).
  std::vector<const ir::Value*> rowOperands;
  auto readPerRow = [&](const ir::Value* value) {
    if (value->isBatched() &&
        std::find(rowOperands.begin(), rowOperands.end(), value) == rowOperands.end())
      rowOperands.push_back(value);
  };
  for (size_t i = group ? group->first + 1 : 0, end = group ? group->last : 0; i < end; ++i) {
    const ir::Instr& instr = *block[i];
    if (instr.op == Op::Slice && instr.operands[0] == &product.result)
      continue; // in registers
    for (const ir::Value* operand : instr.operands)
      if (!KernelEmitter::definedIn(block, *group, operand) &&
          !KernelEmitter::isImmediate(operand)) {
        e.view(operand);
        if (instr.op != Op::Slice)
          readPerRow(operand);
      }
    if (instr.op == Op::Slice) {
      e.view(&instr.result);
      if (!KernelEmitter::definedIn(block, *group, instr.operands[0]))
        readPerRow(&instr.result);
    }
  }
  const View source = e.view(product.operands[0]);
  View x; // the copies of its rows the tiles read (PackedProduct::xBuffer), set below
  View result = group ? View{} : e.view(&product.result);
  llvm::Value* weights = e.buffers[packed.buffer];
  // The rows the tiles read, as they read them: copied, or (int8) quantized.
  auto copyRows = [&](const View& to, const View& from, RowRange rows) {
    if (packed.weights == WeightType::I8)
      quantizeRows(to, from, rows, packed.depth, packed.xStride);
    else if (packed.weights == WeightType::BF16)
      bf16Rows(to, from, rows, packed.depth, packed.depthPairs,
               packed.depthPairs ? 2 * packed.packedDepth() : packed.depth);
    else
      e.copyRows(to, from, rows, packed.depth);
  };
  const int64_t fullBlocks = packed.columns / packed.width;
  const int64_t tailColumns = packed.columns - fullBlocks * packed.width;

  // What runs on the finished tile's row r, columns [j, j + width): the kernel's elementwise
  // work, or (standalone) a store of the sums.
  auto rowBody = [&](llvm::Value* r, llvm::Value* j, int64_t width,
                     std::unordered_map<const ir::Value*, llvm::Value*> values) {
    if (group)
      return kernels.emitKernelBody(block, *group, r, j, width, std::move(values));
    e.b.CreateAlignedStore(values.at(&product.result), e.elementPointer(result, r, j),
                           llvm::Align(4));
  };

  // A finished tile waits in a small stack array (in L1) while one copy of the elementwise
  // code loops over its rows, and over the last block's columns one at a time: copies per
  // row or per column would multiply what LLVM compiles.
  llvm::Type* vec = llvm::FixedVectorType::get(e.f32, static_cast<unsigned>(packed.width));
  llvm::IRBuilder<> entry(&e.fn->getEntryBlock(), e.fn->getEntryBlock().begin());
  llvm::Value* scratch = entry.CreateAlloca(vec, e.constant(tileRows * slices), "tile");
  auto stored = [&](llvm::Value* m, llvm::Value* s) { // the tile's row m, slice s
    return e.b.CreateGEP(vec, scratch, e.b.CreateAdd(e.b.CreateMul(m, e.constant(slices)), s));
  };
  // The elementwise work on rows [firstRow, firstRow + rows) of block blk.
  auto epilogue = [&](llvm::Value* blk, llvm::Value* firstRow, llvm::Value* rows) {
    llvm::Value* j = e.b.CreateMul(blk, e.constant(packed.width));
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
      e.forLoop(e.constant(0), rows, e.constant(1), "tilerow", [&](llvm::Value* m) {
        rowBody(e.b.CreateAdd(firstRow, m), j, packed.width, inRegisters([&](int64_t s) {
                  return e.b.CreateLoad(vec, stored(m, e.constant(s)));
                }));
      });
    };
    if (tailColumns == 0)
      return full();
    auto* fullBlock = llvm::BasicBlock::Create(e.llvmContext, "full_block", e.fn);
    auto* tailBlock = llvm::BasicBlock::Create(e.llvmContext, "tail_block", e.fn);
    auto* done = llvm::BasicBlock::Create(e.llvmContext, "block_done", e.fn);
    e.b.CreateCondBr(e.b.CreateICmpSLT(blk, e.constant(fullBlocks)), fullBlock, tailBlock);
    e.b.SetInsertPoint(fullBlock);
    full();
    e.b.CreateBr(done);
    e.b.SetInsertPoint(tailBlock);
    llvm::Type* lane = llvm::FixedVectorType::get(e.f32, 1);
    e.forLoop(e.constant(0), rows, e.constant(1), "tailrow", [&](llvm::Value* m) {
      e.forLoop(e.constant(0), e.constant(tailColumns), e.constant(1), "tailcol",
                [&](llvm::Value* l) {
                  auto column = [&](int64_t s) { // lane l of the sums as a 1-lane vector
                    llvm::Value* sum = e.b.CreateLoad(vec, stored(m, e.constant(s)));
                    return e.b.CreateInsertElement(llvm::PoisonValue::get(lane),
                                                   e.b.CreateExtractElement(sum, l), uint64_t{0});
                  };
                  rowBody(e.b.CreateAdd(firstRow, m), e.b.CreateAdd(j, l), 1, inRegisters(column));
                });
    });
    e.b.CreateBr(done);
    e.b.SetInsertPoint(done);
  };

  // A tile of `rows` rows from row firstRow, into the stack array from its row firstSlot; with a
  // run-time height, the full tile's rows below it (emitTile).
  auto computeTile = [&](llvm::Value* blk, llvm::Value* firstRow, int64_t rows,
                         const PanelPrefetch& panel, llvm::Value* firstSlot,
                         RunTimeHeight height = {}) {
    emitTile(
        x, weights, packed, blk, firstRow, rows, panel,
        [&](int64_t m, llvm::Value* slice, llvm::Value* sum) {
          e.b.CreateStore(sum, stored(e.b.CreateAdd(firstSlot, e.constant(m)), slice));
        },
        height, stored(firstSlot, e.constant(0)));
  };
  // All the rows in tiles (codegen/TileRows.h), cut where the row count is known. A
  // row-split product cuts only its last tiles short: a tile variant for rows two short would
  // cost compile time for one tile in many.
  // Tiles of every height from half to full are one tile of run-time height (emitTile) where
  // the tile's FMAs take one: fp32, fp16 and bf16 widened (int8 and bf16 pairs keep a variant
  // per height). Single rows keep their tile: it splits the depth between accumulator sets.
  const bool runTimeHeight = !packed.splitRows && packed.weights != WeightType::I8 &&
                             !packed.depthPairs && tileRows / 2 >= 2;
  const TileShapes shapes(tileRows, /*withShorter=*/!packed.splitRows,
                          /*padded=*/packed.splitRows, runTimeHeight);
  const int64_t halfRows = shapes.half;
  // The split of the rows, from the runtime (RunArgs.h, rnnc_tile_split).
  llvm::Value* shapesCode = e.constant(shapes.code());
  auto splitField = [&](RnncTileSplitField field) -> llvm::Value* {
    return e.b.CreateCall(e.tileSplitFn, {batchRows, shapesCode, e.constant(field)});
  };
  const struct {
    llvm::Value *fullEnd, *shortenedEnd, *shorterEnd;
  } split{splitField(RNNC_TILES_FULL_END), splitField(RNNC_TILES_SHORTENED_END),
          splitField(RNNC_TILES_SHORTER_END)};
  // The next block's panel, for the tile at row r of the chunk from chunkBegin: the tiles of a
  // block each ask for a share of it, a line per depth step, tile i for lines from
  // i * passes * depth on (the first tiles of the block cover it). Weights past L2 come from L3
  // or memory a block at a time, and without this the first tile of each block waited on them:
  // at I = H = 1024 (12-16 MB of weights per product) they streamed at the rate of its FMAs,
  // faster than one core reads memory. Zen 5, alternating runs, 1 thread: GRU T=50 B=64
  // I=H=1024 178 -> 190 GFLOP/s, LSTM +8%, tanh RNN +5%; 2 threads +4-6%; I=H=512 unchanged.
  // Weights that L2 holds are not asked for again.
  llvm::Type* element = weightElementType(packed.weights);
  const int64_t lineElements = weightsPerLine(packed);
  const int64_t panelElements = packed.packedDepth() * slices * packed.width;
  const int64_t fullTilePass = slicesPerPass(packed, tileRows, /*spare=*/1);
  const int64_t passes = (slices + fullTilePass - 1) / fullTilePass;
  auto nextPanelPrefetch = [&](llvm::Value* blk, RowRange blocks, llvm::Value* backwards,
                               llvm::Value* chunkBegin, llvm::Value* r) -> PanelPrefetch {
    if (!asksForNextPanels(packed, e.target))
      return {};
    llvm::Value* last = e.b.CreateSub(blocks.end, e.constant(1));
    llvm::Value* after = e.b.CreateAdd(blk, e.constant(1));
    // Past the last block: the pre product's next chunk starts again at the first; a step's
    // walk turns round on the block it ends with.
    llvm::Value* next = e.b.CreateSelect(e.b.CreateICmpSLE(after, last), after,
                                         packed.splitRows ? blocks.begin : last);
    if (backwards) {
      llvm::Value* before = e.b.CreateSub(blk, e.constant(1));
      next = e.b.CreateSelect(
          backwards,
          e.b.CreateSelect(e.b.CreateICmpSGE(before, blocks.begin), before, blocks.begin), next);
    }
    llvm::Value* tileIndex = e.b.CreateSDiv(e.b.CreateSub(r, chunkBegin), e.constant(tileRows));
    return {e.b.CreateGEP(element, weights, e.b.CreateMul(next, e.constant(panelElements))),
            e.b.CreateMul(tileIndex, e.constant(passes * packed.depth)),
            e.constant(panelElements / lineElements - 1), lineElements};
  };
  // Rows [chunkBegin, chunkEnd), whole tiles of `split`, times the blocks [blocks.begin,
  // blocks.end).
  auto chunk = [&](llvm::Value* chunkBegin, llvm::Value* chunkEnd, RowRange blocks) {
    // Odd steps walk the blocks of the recurrent product backwards. When a thread's weights
    // overflow its L2 (batch 1 at H=256 streams 1 MB a step through 512 KB), walking them in
    // the same order every step evicts each block just before it is needed again, and every
    // byte comes from L3; turning round at the end starts the next step on the blocks just
    // used, still in L2 (batch 1 on one thread: 10% faster).
    llvm::Value* backwards =
        e.step && !packed.splitRows
            ? e.b.CreateICmpEQ(e.b.CreateAnd(e.step, e.constant(1)), e.constant(1))
            : nullptr;
    e.forLoop(blocks.begin, blocks.end, e.constant(1), "block", [&](llvm::Value* walked) {
      llvm::Value* blk = walked;
      if (backwards)
        blk = e.b.CreateSelect(backwards,
                               e.b.CreateSub(e.b.CreateAdd(blocks.begin, blocks.end),
                                             e.b.CreateAdd(walked, e.constant(1))),
                               walked);
      // The tile loop: r is the tile's first row; its height follows from where r is.
      auto [r, header, exit] = e.openLoop(chunkBegin, "tile");
      auto* body = llvm::BasicBlock::Create(e.llvmContext, "tile.body", e.fn);
      e.b.CreateCondBr(e.b.CreateICmpSLT(r, chunkEnd), body, exit);
      e.b.SetInsertPoint(body);
      prefetchRows(rowOperands, r, e.b.CreateSub(chunkEnd, e.constant(1)),
                   e.b.CreateMul(blk, e.constant(packed.width)), tileRows);
      const PanelPrefetch nextPanel = nextPanelPrefetch(blk, blocks, backwards, chunkBegin, r);
      llvm::Value* height = e.b.CreateSelect(
          e.b.CreateICmpSLT(r, split.fullEnd), e.constant(shapes.full),
          e.b.CreateSelect(e.b.CreateICmpSLT(r, split.shortenedEnd), e.constant(shapes.shortened),
                           e.b.CreateSelect(e.b.CreateICmpSLT(r, split.shorterEnd),
                                            e.constant(shapes.shorter),
                                            e.b.CreateSub(chunkEnd, r))),
          "height");
      auto* lastRows = llvm::BasicBlock::Create(e.llvmContext, "last_rows", e.fn);
      auto* computed = llvm::BasicBlock::Create(e.llvmContext, "tile_computed", e.fn);
      auto singleRows = [&](llvm::Value* from) { // rows [from, height) of the tile, one by one
        e.forLoop(from, height, e.constant(1), "lastrow", [&](llvm::Value* m) {
          computeTile(blk, e.b.CreateAdd(r, m), 1, PanelPrefetch{}, m);
        });
      };
      if (shapes.padded || shapes.anyHeight) {
        // From half height on, one tile: padded, the full tile (its rows of x have room for a
        // whole tile: the chunk's copies are chunkRows long, each chunk whole tiles); else the
        // tile of run-time height. Single rows below.
        auto* tile = llvm::BasicBlock::Create(e.llvmContext, "tile_half_up", e.fn);
        e.b.CreateCondBr(e.b.CreateICmpSGE(height, e.constant(halfRows)), tile, lastRows);
        e.b.SetInsertPoint(tile);
        computeTile(blk, r, tileRows, nextPanel, e.constant(0),
                    shapes.anyHeight ? RunTimeHeight{height, halfRows} : RunTimeHeight{});
        e.b.CreateBr(computed);
        e.b.SetInsertPoint(lastRows);
        singleRows(e.constant(0));
      } else {
        // One block per tile variant the policy uses; any other height is cut into half
        // tiles, then single rows.
        llvm::SwitchInst* byHeight = e.b.CreateSwitch(height, lastRows, 3);
        for (auto [rows, own] :
             {std::pair{shapes.full, true}, std::pair{shapes.shortened, shapes.hasShortened()},
              std::pair{shapes.shorter, shapes.hasShorter()}}) {
          if (!own)
            continue;
          auto* tile =
              llvm::BasicBlock::Create(e.llvmContext, "tile_" + std::to_string(rows), e.fn);
          byHeight->addCase(e.b.getInt64(static_cast<uint64_t>(rows)), tile);
          e.b.SetInsertPoint(tile);
          computeTile(blk, r, rows, nextPanel, e.constant(0));
          e.b.CreateBr(computed);
        }
        e.b.SetInsertPoint(lastRows);
        llvm::Value* halves =
            e.b.CreateMul(e.b.CreateSDiv(height, e.constant(halfRows)), e.constant(halfRows));
        e.forLoop(e.constant(0), halves, e.constant(halfRows), "halftile", [&](llvm::Value* m) {
          // Single rows (batch 1) have too few FMAs per depth step to hide the prefetch's
          // instructions (AVX2 GRU at batch 1: 19% slower with them).
          computeTile(blk, e.b.CreateAdd(r, m), halfRows,
                      halfRows > 1 ? nextPanel : PanelPrefetch{}, m);
        });
        if (halfRows > 1)
          singleRows(halves);
      }
      e.b.CreateBr(computed);
      e.b.SetInsertPoint(computed);
      epilogue(blk, r, height);
      r->addIncoming(e.b.CreateAdd(r, height), e.b.GetInsertBlock());
      e.b.CreateBr(header);
      e.b.SetInsertPoint(exit);
    });
  };

  // The tiles read copies of the rows of x, each thread its own.
  llvm::Value* rowsPerThread = packed.splitRows ? e.constant(packed.chunkRows) : batchRows;
  llvm::Value* copies = e.b.CreateGEP(
      e.f32, e.buffers[packed.xBuffer],
      e.b.CreateMul(e.b.CreateMul(e.thread, rowsPerThread), e.constant(packed.xStride)),
      "x_copies");
  if (!packed.splitRows) { // the recurrent product: this thread's columns of every row
    x = View{copies, e.constant(packed.xStride)};
    copyRows(x, source, {e.constant(0), batchRows});
    const RowRange mine = e.balancedShare(e.constant(packed.blocks));
    e.shareClock(/*stop=*/false);
    chunk(e.constant(0), batchRows, mine);
    e.shareClock(/*stop=*/true);
    return;
  }
  // Each thread its share of the tiles, in chunks of chunkRows / tileRows tiles.
  llvm::Value* zero = e.constant(0);
  RowRange mine = e.share(splitField(RNNC_TILES_UNITS));
  RowRange allBlocks{zero, e.constant(packed.blocks)};
  const int64_t chunkTiles = packed.chunkRows / tileRows;
  e.forLoop(mine.begin, mine.end, e.constant(chunkTiles), "chunk", [&](llvm::Value* unit) {
    llvm::Value* last = e.b.CreateAdd(unit, e.constant(chunkTiles));
    last = e.b.CreateSelect(e.b.CreateICmpSLT(last, mine.end), last, mine.end);
    llvm::Value* begin = e.b.CreateCall(e.tileUnitStartFn, {batchRows, shapesCode, unit});
    llvm::Value* end = e.b.CreateCall(e.tileUnitStartFn, {batchRows, shapesCode, last});
    // The chunk's rows, addressed by their row numbers.
    x = View{e.b.CreateGEP(e.f32, copies,
                           e.b.CreateNeg(e.b.CreateMul(begin, e.constant(packed.xStride)))),
             e.constant(packed.xStride)};
    copyRows(x, source, {begin, end});
    chunk(begin, end, allBlocks);
  });
}

bool ProductKernelEmitter::anotherWalkPrefetches(const PackedProduct& packed) const {
  return std::any_of(e.plan.packedProducts.begin(), e.plan.packedProducts.end(),
                     [&](const PackedProduct& other) {
                       return &other != &packed && other.tileRows == packed.tileRows &&
                              other.weights == packed.weights && other.xStride == packed.xStride &&
                              asksForNextPanels(other, e.target);
                     });
}

bool ProductKernelEmitter::asksForNextPanels(const PackedProduct& packed, const Target& target) {
  return packed.weights != WeightType::I8 && !packed.depthPairs &&
         packed.packedBytes() > target.l2Bytes;
}

// Asks for the lines the epilogue of the tile at firstRow will read (the premultiplied input
// rows above all: written by the input GEMM long before, and in DRAM by now when the sequence's
// rows outgrow the L3), so that they arrive while the tile's depth loop runs, thousands of
// cycles of FMAs that read only the weights and x (GRU at I=H=1024: 3% faster). Rows past
// lastRow are not asked for (memory past the batch).
void ProductKernelEmitter::prefetchRows(const std::vector<const ir::Value*>& operands,
                                        llvm::Value* firstRow, llvm::Value* lastRow,
                                        llvm::Value* column, int64_t rows) {
  if (operands.empty())
    return;
  std::vector<View> views;
  for (const ir::Value* operand : operands)
    views.push_back(e.view(operand));
  // A loop over the rows, not a copy per row: a dozen trips before thousands of cycles of FMAs,
  // where 14 rows of two operands unrolled were 220 instructions for LLVM to compile per product.
  llvm::Value* end = e.b.CreateAdd(firstRow, e.constant(rows));
  llvm::Value* pastLast = e.b.CreateAdd(lastRow, e.constant(1));
  end = e.b.CreateSelect(e.b.CreateICmpSLT(end, pastLast), end, pastLast);
  e.forLoop(firstRow, end, e.constant(1), "prefetch_row", [&](llvm::Value* row) {
    for (const View& v : views) // a read, to be kept close (locality 3: into L1), of data
      e.b.CreateIntrinsic(
          llvm::Intrinsic::prefetch, {e.ptr},
          {e.elementPointer(v, row, column), e.b.getInt32(0), e.b.getInt32(3), e.b.getInt32(1)});
  });
}

std::vector<ProductKernelEmitter::Accumulators> ProductKernelEmitter::accumulateOverDepth(
    int64_t chains, int64_t steps, size_t accumulators, llvm::Value* zero,
    const std::function<void(llvm::Value* k, Accumulators& acc)>& step, const std::string& name,
    llvm::Value* runTimeSteps) {
  RNNC_INTERNAL_CHECK(!runTimeSteps || chains == 1, "a depth known at run time takes one set");
  std::vector<Accumulators> acc(static_cast<size_t>(chains), Accumulators(accumulators, zero));
  // The accumulators are the loop's phis. It is not unrolled beyond the chains: the FMAs of one
  // depth already hide their latency, and a bigger body only costs compile time (unrolled twice,
  // an AVX-512 walk's 28 accumulators and the next step's weights outgrew the 32 registers: the
  // default LSTM 1.4x slower, Intel Xeon).
  const int64_t loopSteps = steps / chains * chains; // all of them with one set
  if (loopSteps > 0) {
    llvm::BasicBlock* before = e.b.GetInsertBlock();
    auto [k, header, exit] = e.openLoop(e.constant(0), name);
    std::vector<std::vector<llvm::PHINode*>> phis(static_cast<size_t>(chains));
    for (int64_t c = 0; c < chains; ++c)
      for (size_t i = 0; i < accumulators; ++i) {
        llvm::PHINode* phi = e.b.CreatePHI(zero->getType(), 2);
        phi->addIncoming(zero, before);
        phis[c].push_back(phi);
        acc[c][i] = phi;
      }
    for (int64_t c = 0; c < chains; ++c)
      step(c == 0 ? k : e.b.CreateAdd(k, e.constant(c)), acc[c]);
    llvm::Value* next = e.b.CreateAdd(k, e.constant(chains));
    llvm::BasicBlock* latch = e.b.GetInsertBlock();
    for (int64_t c = 0; c < chains; ++c)
      for (size_t i = 0; i < accumulators; ++i)
        phis[c][i]->addIncoming(acc[c][i], latch);
    k->addIncoming(next, latch);
    e.b.CreateCondBr(e.b.CreateICmpSLT(next, runTimeSteps ? runTimeSteps : e.constant(loopSteps)),
                     header, exit);
    e.b.SetInsertPoint(exit);
  }
  for (int64_t rest = loopSteps; rest < steps; ++rest)
    step(e.constant(rest), acc[0]);
  return acc;
}

std::vector<std::vector<llvm::Value*>> ProductKernelEmitter::loadWeightParts(
    const PackedProduct& packed, const std::vector<llvm::Value*>& sliceWords, int64_t first,
    llvm::Value* k, int64_t parts, int64_t lanes, llvm::Type* type) {
  auto* words = llvm::FixedVectorType::get(e.b.getInt32Ty(), static_cast<unsigned>(lanes));
  std::vector<std::vector<llvm::Value*>> w(sliceWords.size());
  for (size_t s = 0; s < sliceWords.size(); ++s)
    for (int64_t part = 0; part < parts; ++part) {
      llvm::Value* at = e.b.CreateAdd(
          e.b.CreateMul(k, e.constant(packed.panelWidth(first + static_cast<int64_t>(s)))),
          e.constant(part * lanes));
      w[s].push_back(e.b.CreateBitCast(
          e.b.CreateAlignedLoad(words, e.b.CreateGEP(e.b.getInt32Ty(), sliceWords[s], at),
                                llvm::Align(4)),
          type));
    }
  return w;
}

llvm::Value* ProductKernelEmitter::joinParts(std::vector<llvm::Value*> parts) {
  while (parts.size() > 1) { // concatenated pairwise: 16 + 16 -> 32, 32 + 32 -> 64 lanes
    std::vector<llvm::Value*> joined;
    for (size_t i = 0; i < parts.size(); i += 2) {
      auto n = llvm::cast<llvm::FixedVectorType>(parts[i]->getType())->getNumElements();
      std::vector<int> mask(2 * n);
      for (unsigned j = 0; j < 2 * n; ++j)
        mask[j] = static_cast<int>(j);
      joined.push_back(e.b.CreateShuffleVector(parts[i], parts[i + 1], mask));
    }
    parts = std::move(joined);
  }
  return parts[0];
}

llvm::Value* ProductKernelEmitter::sumOfSets(const std::vector<Accumulators>& sets, size_t first,
                                             int64_t parts) {
  std::vector<llvm::Value*> part;
  for (size_t q = first; q < first + static_cast<size_t>(parts); ++q) {
    llvm::Value* total = sets[0][q];
    for (size_t c = 1; c < sets.size(); ++c)
      total = total->getType()->isFPOrFPVectorTy() ? e.b.CreateFAdd(total, sets[c][q])
                                                   : e.b.CreateAdd(total, sets[c][q]);
    part.push_back(total);
  }
  return joinParts(std::move(part));
}

// As many slices per pass as the full tile's accumulators allow for this many rows, and as the
// registers hold with each slice's weights and the spare ones beside them (3 rows x 4 slices is
// 17 registers of AVX2's 16: LLVM spilled accumulators in the depth loop, which ran at less than
// half speed); the slices then split evenly between passes.
int64_t ProductKernelEmitter::slicesPerPass(const PackedProduct& packed, int64_t rows,
                                            int64_t spare) const {
  const int64_t accumulators = packed.tileRows * packed.passSlices;
  const int64_t vectorsPerSlice = std::max<int64_t>(1, packed.width / e.target.vectorWidth);
  const int64_t fitting =
      std::max<int64_t>(1, std::min(accumulators / rows, (e.target.vectorRegisters - spare) /
                                                             (vectorsPerSlice * (rows + 1))));
  const int64_t passes = (packed.slices() + fitting - 1) / fitting;
  return (packed.slices() + passes - 1) / passes;
}

// Few rows (a batch-1 step) leave few accumulators: each FMA then waits for the one before it on
// the same accumulator (4 cycles), not for the FMA units. The depth is then split between sets
// of accumulators (depth k to set k % sets), added at the end: 8 chains at least where the
// registers hold them beside the weights and the spare ones.
int64_t ProductKernelEmitter::accumulatorSets(const PackedProduct& packed, int64_t rows,
                                              int64_t count, int64_t spare, int64_t depth) const {
  const int64_t vectorsPerSlice = std::max<int64_t>(1, packed.width / e.target.vectorWidth);
  const int64_t perSet = rows * count * vectorsPerSlice;
  int64_t sets = 1;
  while (sets < 4 && perSet * sets < 8 && sets * 2 <= depth &&
         perSet * sets * 2 + count * vectorsPerSlice + spare <= e.target.vectorRegisters)
    sets *= 2;
  return sets;
}

// Rows [firstRow, firstRow + rows) of x times block `blk` of the packed weights. The slices
// are accumulated in passes of as many as the tile's accumulators allow for this many rows
// (a panel for a full tile, all of them for one row); each pass is one walk over the depth.
void ProductKernelEmitter::emitTile(const View& x, llvm::Value* weights,
                                    const PackedProduct& packed, llvm::Value* blk,
                                    llvm::Value* firstRow, int64_t rows,
                                    const PanelPrefetch& nextPanel, const TileStore& store,
                                    RunTimeHeight height, llvm::Value* tileMemory) {
  if (packed.weights == WeightType::I8 || packed.depthPairs) {
    RNNC_INTERNAL_CHECK(!height.rows, "int8 and bf16-pair tiles have no run-time height");
    const Tile sums = packed.amxTiles ? emitAmxTile(x, weights, packed, blk, firstRow, rows)
                      : packed.weights == WeightType::I8
                          ? emitInt8Tile(x, weights, packed, blk, firstRow, rows)
                          : emitBf16PairTile(x, weights, packed, blk, firstRow, rows);
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t s = 0; s < packed.slices(); ++s)
        store(m, e.constant(s), sums[static_cast<size_t>(m)][static_cast<size_t>(s)]);
    return;
  }
  const int64_t slices = packed.slices();
  const int64_t perPass = slicesPerPass(packed, rows, /*spare=*/1);
  const int64_t passes = (slices + perPass - 1) / perPass;
  llvm::Type* element = weightElementType(packed.weights);
  // fp16 weights of single rows on Zen 4 are widened half a zmm at a time, and their FMAs too:
  // there a zmm vcvtph2ps takes two cycles and a ymm one takes half of one, and at one row each
  // widened weight feeds a single FMA, so the widening bounds the step (`rnnc_bench
  // --benchmark_filter=weightGemv`: fp16 in ymm 44.8 G weights/s, in zmm 29.3, fp32 23.8). The
  // halves' sums are joined at the end. Elsewhere (Intel, Zen 5) a zmm widens at full rate.
  const bool halfWidths = packed.weights == WeightType::F16 && e.target.vectorWidth == 16 &&
                          packed.width % 16 == 0 && rows == 1 && e.target.cpu == "znver4";
  // Blocks wider than a register (the input projection's: two) are as many register-wide
  // parts in the IR, not one wide vector that LLVM's type legalizer splits: the same machine
  // code, and a third less of the setup part's back end (Zen 5, the LSTM's: 15-17 -> 10-12 ms
  // of work).
  const int64_t vectorWidth = e.target.vectorWidth;
  const int64_t parts = halfWidths ? packed.width / 8
                        : packed.width > vectorWidth && packed.width % vectorWidth == 0
                            ? packed.width / vectorWidth
                            : 1;
  const int64_t partWidth = packed.width / parts;
  llvm::Type* partVec = llvm::FixedVectorType::get(e.f32, static_cast<unsigned>(partWidth));
  llvm::Type* partPackedVec = llvm::FixedVectorType::get(element, static_cast<unsigned>(partWidth));
  // Every address is a base computed once plus the depth (times the panel's width).
  const EmitContext::TileRows inputRows(e, x, firstRow, rows);
  llvm::Value* blockWeights =
      e.b.CreateGEP(element, weights,
                    e.b.CreateMul(blk, e.constant(packed.packedDepth() * slices * packed.width)));
  // Passes alike: every pass as many slices, pass p's slice s at the first pass's start plus p
  // times a fixed distance, with the same panel width.
  bool alike = passes > 1 && slices % perPass == 0;
  const int64_t passDistance = passes > 1 ? packed.sliceStart(perPass) - packed.sliceStart(0) : 0;
  for (int64_t p = 0; alike && p < passes; ++p)
    for (int64_t s = 0; alike && s < perPass; ++s)
      alike = packed.sliceStart(p * perPass + s) == packed.sliceStart(s) + p * passDistance &&
              packed.panelWidth(p * perPass + s) == packed.panelWidth(s);

  // One walk over the depth for the slices [first, first + count), pass `pass` (a constant, or
  // the run-time pass), their weights from `passWeights`, the rows of x from `rowsOfX`, each
  // row's sum of each slice given to `sliceSum` (the slice counted from `first`).
  using SliceSum = std::function<void(int64_t row, int64_t slice, llvm::Value* sum)>;
  auto walkBody = [&](int64_t first, int64_t count, llvm::Value* pass, llvm::Value* passWeights,
                      const EmitContext::TileRows& rowsOfX, const PanelPrefetch& panel,
                      RunTimeHeight rowsHeight, bool joinedParts, const SliceSum& sliceSum,
                      int64_t realRows = 0, llvm::Value* runTimeDepth = nullptr,
                      llvm::Value* runTimePanelWidth = nullptr) {
    // Without a run-time height, `realRows` rows are computed (0: all of them); the sums of the
    // rest are zero. With `runTimeDepth`, the depth is that many steps (a walk shared by
    // products of different depths); with `runTimePanelWidth`, the weights of consecutive
    // depths are that many elements apart (a walk shared by products of other panels).
    std::vector<llvm::Value*> sliceWeights;
    for (int64_t s = first; s < first + count; ++s)
      sliceWeights.push_back(e.b.CreateConstGEP1_64(
          element, passWeights, packed.sliceStart(s) - packed.sliceStart(first)));
    const int64_t chains = accumulatorSets(packed, rows, count, /*spare=*/1, packed.depth);
    // The next panel's lines this walk asks for, one a depth step from its first: where that is
    // past the panel's last line, the last line at every step. Decided once, before the depth
    // loop, so that a step asks at a base plus the depth times a run-time distance (a multiply
    // and the prefetch, where the line's compare-and-select was four instructions beside an AVX2
    // walk's 12 FMAs). A tile whose lines run past the last one asks for fewer than a depth's
    // worth of lines beyond the panel: a prefetch never faults.
    llvm::Value *panelLines = nullptr, *lineDistance = nullptr;
    if (panel.panel) {
      llvm::Value* start =
          e.b.CreateAdd(panel.firstLine, e.b.CreateMul(pass, e.constant(packed.depth)));
      llvm::Value* moving = e.b.CreateICmpSLT(start, panel.lastLine);
      start = e.b.CreateSelect(moving, start, panel.lastLine);
      panelLines =
          e.b.CreateGEP(element, panel.panel, e.b.CreateMul(start, e.constant(panel.lineElements)));
      lineDistance = e.b.CreateSelect(moving, e.constant(panel.lineElements), e.constant(0));
    }
    // One depth step into accumulator set `acc` ([row * count + slice]): the slices' weights,
    // each row's input broadcast, their FMAs.
    auto step = [&](llvm::Value* k, Accumulators& acc) {
      if (panel.panel) {
        e.b.CreateIntrinsic(llvm::Intrinsic::prefetch, {e.ptr},
                            {e.b.CreateGEP(element, panelLines, e.b.CreateMul(k, lineDistance)),
                             e.b.getInt32(0), e.b.getInt32(2), e.b.getInt32(1)});
      }
      // Each slice's weights in `parts` vectors of `partWidth` lanes (halfWidths, parts above).
      std::vector<llvm::Value*> w; // [slice * parts + part]
      for (int64_t s = 0; s < count; ++s)
        for (int64_t q = 0; q < parts; ++q)
          w.push_back(widenWeights(
              e.b.CreateAlignedLoad(
                  partPackedVec,
                  e.b.CreateGEP(element, sliceWeights[s],
                                e.b.CreateAdd(e.b.CreateMul(k, runTimePanelWidth
                                                                   ? runTimePanelWidth
                                                                   : e.constant(packed.panelWidth(
                                                                         first + s))),
                                              e.constant(q * partWidth))),
                  llvm::Align(static_cast<uint64_t>(weightTypeBytes(packed.weights)))),
              packed.weights));
      auto rowFmas = [&](int64_t m, Accumulators& acc) {
        llvm::Value* input = e.b.CreateVectorSplat(
            static_cast<unsigned>(partWidth),
            e.b.CreateAlignedLoad(e.f32, rowsOfX.at(m, e.f32, k), llvm::Align(4)));
        for (int64_t s = 0; s < count; ++s)
          for (int64_t q = 0; q < parts; ++q) {
            llvm::Value*& a = acc[static_cast<size_t>((m * count + s) * parts + q)];
            a = e.b.CreateIntrinsic(llvm::Intrinsic::fma, {partVec},
                                    {input, w[static_cast<size_t>(s * parts + q)], a});
          }
      };
      const int64_t fixedRows = rowsHeight.rows ? rowsHeight.atLeast : realRows ? realRows : rows;
      for (int64_t m = 0; m < fixedRows; ++m)
        rowFmas(m, acc);
      if (fixedRows < rows && rowsHeight.rows)
        emitRowsBelowHeight(rowsHeight.rows, fixedRows, rows, static_cast<size_t>(count * parts),
                            acc, rowFmas);
    };
    const std::vector<Accumulators> acc =
        accumulateOverDepth(chains, packed.depth, static_cast<size_t>(rows * count * parts),
                            llvm::ConstantFP::get(partVec, 0.0), step, "depth", runTimeDepth);
    // Each slice's parts joined (`sliceSum` gets slice s), or each part on its own (vector v
    // = s * parts + q).
    const int64_t joined = joinedParts ? parts : 1;
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t v = 0; v < count * parts / joined; ++v)
        sliceSum(m, v, sumOfSets(acc, static_cast<size_t>(m * count * parts + v * joined), joined));
  };
  // A full tile's walks are functions of their own where the part emitted calls for them
  // (EmitContext::TileWalks): the setup part defines them and the loop calls them, and a walk
  // of the same shape (the input projection's and the recurrent product's of an LSTM with
  // I = H) is one function. Its name says its shape, so the two parts agree on it. Its
  // arguments: the tile's first row of x, the pass's weights, where its sums go (the pass's
  // slices side by side, then the next row that many floats on), the tile's height, the next
  // panel's prefetch (its panel, first line and last line), the depth and the weights' panel
  // width. Tiles of a fixed height (a padded input projection's) call it with their full height.
  llvm::Type* vec = llvm::FixedVectorType::get(e.f32, static_cast<unsigned>(packed.width));
  const bool outlined = tileMemory && e.tileWalks != EmitContext::TileWalks::Inline &&
                        rows == packed.tileRows && rows / 2 >= 2 && !halfWidths &&
                        llvm::isa<llvm::ConstantInt>(x.rowStride);
  const int64_t walkAtLeast = std::max<int64_t>(1, rows / 2);
  // A tile with no next panel to ask for (its weights within L2) takes the walk of its shape
  // that asks for one where the module has it already, or where another product tiled alike
  // asks for panels (anotherWalkPrefetches), and passes its own weights' first line,
  // line 0 at every depth step: an LSTM with a projection has its input projection's walk
  // (weights past L2) and its projection's (within) of one shape, and this spares LLVM the
  // second, 6.5 ms of work in the part that took the longest. The walk's step then has the
  // prefetch's few instructions beside its 28 FMAs (a walk that always prefetched made an LSTM
  // at I = H = 256, all of whose walks need none, about 2% slower). Only with 32 registers: AVX2
  // walks, 12 FMAs a step, keep theirs apart. The loop part declares the setup's walks first
  // (CellEmitter), so that both parts decide alike.
  const int64_t walkLineElements = weightsPerLine(packed);
  struct Walk {
    llvm::Function* function;
    bool prefetches; // takes a panel to ask for: the caller passes one, or its own weights
  };
  auto walkFunction = [&](int64_t first, int64_t count) -> Walk {
    // By what the code does: rows, depth (with several accumulator sets), accumulator sets, the
    // row stride of x, and each register-wide vector of weights by its offset in the pass's
    // weights. An LSTM's input projection (one slice two registers wide) and its recurrent
    // product (two slices a pass, a register each) walk alike.
    // A walk of one accumulator set takes its depth at run time ("kN"): the products of an
    // LSTM with I != H (and one with a projection) share it, their rows of x as far apart
    // (StoragePlan's xStride), where each depth had a walk of its own, 5-10 ms of LLVM's work
    // in the part that takes the longest. The weights' panel width (their stride per depth) is
    // a run-time argument ("N") too: an LSTM's recurrent product, its four slices in one panel
    // (StoragePlan), walks two of them a pass, as its input projection walks its one slice two
    // registers wide, at other strides.
    RNNC_INTERNAL_CHECK(first / packed.panelSlices == (first + count - 1) / packed.panelSlices,
                        "a walk's slices lie in one panel");
    const int64_t chains = accumulatorSets(packed, rows, count, /*spare=*/1, packed.depth);
    const bool runTimeDepth = chains == 1 && packed.depth > 0; // its loop runs at least once
    std::string name =
        "rnnc_walk." + std::to_string(rows) + "r" + std::to_string(walkAtLeast) + "." +
        std::string(weightTypeName(packed.weights)) + "x" + std::to_string(partWidth) + ".k" +
        (runTimeDepth ? std::string("N") : std::to_string(packed.depth)) + "c" +
        std::to_string(chains) + ".x" +
        std::to_string(llvm::cast<llvm::ConstantInt>(x.rowStride)->getSExtValue()) + ".w";
    for (int64_t s = first; s < first + count; ++s)
      for (int64_t q = 0; q < parts; ++q)
        name +=
            std::to_string(packed.sliceStart(s) - packed.sliceStart(first) + q * partWidth) + "_N_";
    const std::string prefetching = name + "p" + std::to_string(walkLineElements);
    const bool prefetches = nextPanel.panel != nullptr ||
                            (sharesPrefetchingWalks(e.target) &&
                             (e.module->getFunction(prefetching) || anotherWalkPrefetches(packed)));
    name = prefetches ? prefetching : name + "np";
    if (llvm::Function* known = e.module->getFunction(name))
      return {known, prefetches};
    auto* type = llvm::FunctionType::get(
        e.b.getVoidTy(), {e.ptr, e.ptr, e.ptr, e.i64, e.i64, e.ptr, e.i64, e.i64, e.i64, e.i64},
        false);
    auto* walk = llvm::Function::Create(type, llvm::Function::ExternalLinkage, name, *e.module);
    walk->copyAttributesFrom(e.fn);
    for (unsigned i : {0u, 1u, 2u})
      walk->addParamAttr(i, llvm::Attribute::NoAlias);
    if (e.tileWalks != EmitContext::TileWalks::Defined)
      return {walk, prefetches};
    llvm::Function* caller = e.fn;
    const llvm::IRBuilderBase::InsertPoint callerAt = e.b.saveIP();
    e.fn = walk;
    e.b.SetInsertPoint(llvm::BasicBlock::Create(e.llvmContext, "entry", walk));
    const EmitContext::TileRows walkRows(e, View{walk->getArg(0), x.rowStride}, e.constant(0),
                                         rows);
    PanelPrefetch walkPanel;
    if (prefetches)
      walkPanel = {walk->getArg(5), walk->getArg(6), walk->getArg(7), walkLineElements};
    llvm::Value* depth = runTimeDepth ? walk->getArg(8) : nullptr;
    llvm::Value* panelWidth = walk->getArg(9);
    auto storeSum = [&](int64_t m, int64_t v, llvm::Value* sum) {
      e.b.CreateStore(sum,
                      e.b.CreateGEP(e.f32, walk->getArg(2),
                                    e.b.CreateAdd(e.b.CreateMul(e.constant(m), walk->getArg(3)),
                                                  e.constant(v * partWidth))));
    };
    // Where a depth step is few FMAs (AVX2's 6 x 2: 6 cycles), the run-time height's
    // compare-and-branches, beside the loop's counter and the prefetch's address, made it 32
    // uops, more than a 6-wide core (Intel's Golden Cove) issues in those cycles: there each
    // height has a depth loop of its own, the height tested once before them (AVX2 LSTM on an
    // Intel Xeon: 6.6% faster; AVX-512's 28 FMAs a step gained nothing, so it keeps one loop).
    if (e.target.vectorRegisters <= 16) {
      auto* walked = llvm::BasicBlock::Create(e.llvmContext, "walked", walk);
      for (int64_t h = rows; h >= walkAtLeast; --h) {
        auto* at = llvm::BasicBlock::Create(e.llvmContext, "height" + std::to_string(h), walk);
        auto* lower = h > walkAtLeast ? llvm::BasicBlock::Create(e.llvmContext,
                                                                 "below" + std::to_string(h), walk)
                                      : nullptr;
        if (lower)
          e.b.CreateCondBr(e.b.CreateICmpSGE(walk->getArg(4), e.constant(h)), at, lower);
        else
          e.b.CreateBr(at);
        e.b.SetInsertPoint(at);
        walkBody(first, count, e.constant(0), walk->getArg(1), walkRows, walkPanel, RunTimeHeight{},
                 /*joinedParts=*/false, storeSum, h, depth, panelWidth);
        e.b.CreateBr(walked);
        if (lower)
          e.b.SetInsertPoint(lower);
      }
      e.b.SetInsertPoint(walked);
    } else {
      walkBody(first, count, e.constant(0), walk->getArg(1), walkRows, walkPanel,
               RunTimeHeight{walk->getArg(4), walkAtLeast}, /*joinedParts=*/false, storeSum,
               /*realRows=*/0, depth, panelWidth);
    }
    e.b.CreateRetVoid();
    e.fn = caller;
    e.b.restoreIP(callerAt);
    return {walk, prefetches};
  };
  auto walk = [&](int64_t first, int64_t count, llvm::Value* pass, llvm::Value* passWeights) {
    llvm::Value* firstSlice = e.b.CreateMul(pass, e.constant(perPass)); // = first
    if (!outlined)
      return walkBody(first, count, pass, passWeights, inputRows, nextPanel, height,
                      /*joinedParts=*/true, [&](int64_t m, int64_t s, llvm::Value* sum) {
                        store(m, e.b.CreateAdd(firstSlice, e.constant(s)), sum);
                      });
    const Walk called = walkFunction(first, count);
    // No panel: no pointer, or for a walk that asks for one, the pass's own weights (line 0).
    llvm::Value* noPanel = called.prefetches ? passWeights : llvm::ConstantPointerNull::get(e.ptr);
    e.b.CreateCall(called.function,
                   {inputRows.start(0), passWeights, e.b.CreateGEP(vec, tileMemory, firstSlice),
                    e.constant(slices * packed.width), height.rows ? height.rows : e.constant(rows),
                    nextPanel.panel ? nextPanel.panel : noPanel,
                    nextPanel.panel ? e.b.CreateAdd(nextPanel.firstLine,
                                                    e.b.CreateMul(pass, e.constant(packed.depth)))
                                    : e.constant(0),
                    nextPanel.panel ? nextPanel.lastLine : e.constant(0), e.constant(packed.depth),
                    e.constant(packed.panelWidth(first))});
  };
  if (alike) {
    e.forLoop(e.constant(0), e.constant(passes), e.constant(1), "pass", [&](llvm::Value* p) {
      walk(0, perPass, p,
           e.b.CreateGEP(element, blockWeights,
                         e.b.CreateAdd(e.constant(packed.sliceStart(0)),
                                       e.b.CreateMul(p, e.constant(passDistance)))));
    });
    return;
  }
  for (int64_t first = 0; first < slices; first += perPass)
    walk(first, std::min(perPass, slices - first), e.constant(first / perPass),
         e.b.CreateConstGEP1_64(element, blockWeights, packed.sliceStart(first)));
}

void ProductKernelEmitter::emitRowsBelowHeight(
    llvm::Value* height, int64_t from, int64_t to, size_t perRow, Accumulators& acc,
    const std::function<void(int64_t m, Accumulators& acc)>& rowFmas) {
  auto* done = llvm::BasicBlock::Create(e.llvmContext, "rows_done", e.fn);
  std::vector<llvm::BasicBlock*> rowBlocks(static_cast<size_t>(to)), enteredFrom(rowBlocks);
  for (int64_t m = to - 1; m >= from; --m)
    rowBlocks[static_cast<size_t>(m)] =
        llvm::BasicBlock::Create(e.llvmContext, "row" + std::to_string(m), e.fn);
  // Height h enters at row h - 1, found by comparisons from the full height down: the heights
  // the split gives most (full, one or two rows short) take one to three compare-and-branches
  // a depth step, where a jump table (a load and an indirect jump) made an LSTM's step 4%
  // slower at 13 and 12 rows. A height of `from` computes none of them.
  for (int64_t h = to; h > from; --h) {
    enteredFrom[static_cast<size_t>(h - 1)] = e.b.GetInsertBlock();
    auto* lower = h > from + 1
                      ? llvm::BasicBlock::Create(e.llvmContext, "below" + std::to_string(h), e.fn)
                      : done;
    e.b.CreateCondBr(e.b.CreateICmpSGE(height, e.constant(h)),
                     rowBlocks[static_cast<size_t>(h - 1)], lower);
    if (lower != done)
      e.b.SetInsertPoint(lower);
  }
  llvm::BasicBlock* noneFrom = e.b.GetInsertBlock(); // the last comparison: no row past `from`
  const Accumulators before = acc;
  // The row block last emitted and its accumulators at its end.
  llvm::BasicBlock* above = nullptr;
  Accumulators fromAbove;
  // Rows above m reach row m's block (or `done`, m = from - 1) from a comparison (untouched)
  // or from the row above.
  auto joinRowsAbove = [&](int64_t m, llvm::BasicBlock* compared) {
    for (size_t i = static_cast<size_t>(m + 1) * perRow; i < static_cast<size_t>(to) * perRow;
         ++i) {
      llvm::PHINode* phi = e.b.CreatePHI(before[i]->getType(), 2);
      phi->addIncoming(before[i], compared);
      phi->addIncoming(fromAbove[i], above);
      acc[i] = phi;
    }
  };
  for (int64_t m = to - 1; m >= from; --m) {
    e.b.SetInsertPoint(rowBlocks[static_cast<size_t>(m)]);
    if (above)
      joinRowsAbove(m, enteredFrom[static_cast<size_t>(m)]);
    rowFmas(m, acc);
    above = e.b.GetInsertBlock();
    fromAbove = acc;
    e.b.CreateBr(m > from ? rowBlocks[static_cast<size_t>(m - 1)] : done);
  }
  e.b.SetInsertPoint(done);
  joinRowsAbove(from - 1, noneFrom);
}

} // namespace rnnc::codegen

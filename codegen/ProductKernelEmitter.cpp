// Matrix products in register tiles: weights packed in tile order by the parameter phase, tiles
// accumulated over the depth, then the elementwise work of the kernel the product is fused into
// (passes/FuseMatMul.h) run on each tile, or the tile stored (a standalone product).
#include "codegen/Emitter.h"
#include "codegen/TileRows.h"

#include "ir/Error.h"

#include <algorithm>

namespace rnnc::codegen {
namespace {

// TileRows.h's arithmetic on run-time values: the policy emitted as IR.
struct IRArithmetic {
  using Int = llvm::Value*;
  Builder& b;
  Int constant(int64_t v) const { return b.getInt64(static_cast<uint64_t>(v)); }
  Int add(Int x, Int y) const { return b.CreateAdd(x, y); }
  Int sub(Int x, Int y) const { return b.CreateSub(x, y); }
  Int mul(Int x, Int y) const { return b.CreateMul(x, y); }
  Int div(Int x, Int y) const { return b.CreateSDiv(x, y); }
  Int lessEqual(Int x, Int y) const { return b.CreateICmpSLE(x, y); }
  Int select(Int c, Int x, Int y) const { return b.CreateSelect(c, x, y); }
};

} // namespace

using ir::Op;

// Packs a fused product's weights in tile order (StoragePlan.h, PackedProduct): per block of
// columns, per depth k, each slice's `width` weights side by side; zero past the columns.
void Emitter::emitPacking(const PackedProduct& packed) {
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

// A product computed in tiles (StoragePlan.h, PackedProduct): per chunk of rows, per block of
// `width` columns, per tile of rows, the product's columns of every slice are computed in
// registers, then the kernel's elementwise work runs on them (a standalone product: they are
// stored). Blocks are outside the tiles so that a block's packed weights stay in cache while
// every row of the chunk uses them; chunks (of a row-split product) are outside the blocks so
// that their rows of x stay in L2 while every block passes over them.
void Emitter::emitProductKernel(const ir::Block& block, const KernelGroup* group,
                                const PackedProduct& packed, llvm::Value* batchRows) {
  const ir::Instr& product = *packed.product;
  const int64_t slices = static_cast<int64_t>(packed.offsets.size());
  const int64_t tileRows = packed.tileRows;
  std::vector<std::vector<const ir::Value*>> sliceValues(static_cast<size_t>(slices));
  std::vector<const ir::Value*> rowOperands; // what the epilogue reads per row
  if (!group)
    sliceValues[0].push_back(&product.result);
  for (size_t i = group ? group->first + 1 : 0; group && i < group->last; ++i) {
    const ir::Instr& instr = *block[i];
    if (instr.op == Op::Slice && instr.operands[0] == &product.result) {
      auto at = std::find(packed.offsets.begin(), packed.offsets.end(),
                          instr.attrs.offset.constantValue());
      sliceValues[static_cast<size_t>(at - packed.offsets.begin())].push_back(&instr.result);
      continue;
    }
    for (const ir::Value* operand : instr.operands)
      if (!definedIn(block, *group, operand) && !isImmediate(operand)) {
        view(operand);
        if (operand->isBatched() &&
            std::find(rowOperands.begin(), rowOperands.end(), operand) == rowOperands.end())
          rowOperands.push_back(operand);
      }
    if (instr.op == Op::Slice)
      view(&instr.result);
  }
  View x = view(product.operands[0]); // read from copies, below
  View result = group ? View{} : view(&product.result);
  llvm::Value* weights = buffers_[packed.buffer];
  const int64_t fullBlocks = packed.columns / packed.width;
  const int64_t tailColumns = packed.columns - fullBlocks * packed.width;

  // What runs on the finished tile's row r, columns [j, j + width): the kernel's elementwise
  // work, or (standalone) a store of the sums.
  auto rowBody = [&](llvm::Value* r, llvm::Value* j, int64_t width,
                     std::unordered_map<const ir::Value*, llvm::Value*> values) {
    if (group)
      return emitKernelBody(block, *group, r, j, width, std::move(values));
    b_.CreateAlignedStore(values.at(&product.result), elementPointer(result, r, j),
                          llvm::Align(4));
  };

  // A finished tile waits in a small stack array (in L1) while one copy of the elementwise
  // code loops over its rows, and over the last block's columns one at a time: copies per
  // row or per column would multiply what LLVM compiles.
  llvm::Type* vec = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(packed.width));
  llvm::IRBuilder<> entry(&fn_->getEntryBlock(), fn_->getEntryBlock().begin());
  llvm::Value* scratch = entry.CreateAlloca(vec, constant(tileRows * slices), "tile");
  auto stored = [&](llvm::Value* m, int64_t s) { // the tile's row m, slice s
    return b_.CreateGEP(vec, scratch, b_.CreateAdd(b_.CreateMul(m, constant(slices)), constant(s)));
  };
  // The elementwise work on rows [firstRow, firstRow + rows) of block blk.
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
        rowBody(b_.CreateAdd(firstRow, m), j, packed.width,
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
        rowBody(b_.CreateAdd(firstRow, m), b_.CreateAdd(j, l), 1, inRegisters(column));
      });
    });
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  };

  auto storeTile = [&](const Tile& sums, llvm::Value* firstSlot) {
    for (size_t m = 0; m < sums.size(); ++m)
      for (int64_t s = 0; s < slices; ++s)
        b_.CreateStore(sums[m][s],
                       stored(b_.CreateAdd(firstSlot, constant(static_cast<int64_t>(m))), s));
  };
  // Rows [chunkBegin, chunkEnd) times the blocks [blocks.begin, blocks.end).
  auto chunk = [&](llvm::Value* chunkBegin, llvm::Value* chunkEnd, RowRange blocks) {
    // The chunk's rows in tiles (codegen/TileRows.h), cut where the row count is known.
    // A row-split product cuts only its last chunk short: a tile variant for rows two short
    // would cost compile time for one tile in many.
    const TileShapes shapes(tileRows, /*withShorter=*/!packed.splitRows);
    const int64_t halfRows = shapes.half;
    IRArithmetic arithmetic{b_};
    const TileSplit<IRArithmetic> split = splitIntoTiles(arithmetic, chunkBegin, chunkEnd, shapes);
    // Odd steps walk the blocks of the recurrent product backwards. When a thread's weights
    // overflow its L2 (batch 1 at H=256 streams 1 MB a step through 512 KB), walking them in
    // the same order every step evicts each block just before it is needed again, and every
    // byte comes from L3; turning round at the end starts the next step on the blocks just
    // used, still in L2 (batch 1 on one thread: 10% faster).
    llvm::Value* backwards = step_ && !packed.splitRows
                                 ? b_.CreateICmpEQ(b_.CreateAnd(step_, constant(1)), constant(1))
                                 : nullptr;
    forLoop(blocks.begin, blocks.end, constant(1), "block", [&](llvm::Value* walked) {
      llvm::Value* blk = walked;
      if (backwards)
        blk = b_.CreateSelect(backwards,
                              b_.CreateSub(b_.CreateAdd(blocks.begin, blocks.end),
                                           b_.CreateAdd(walked, constant(1))),
                              walked);
      // The tile loop: r is the tile's first row; its height follows from where r is.
      auto [r, header, exit] = openLoop(chunkBegin, "tile");
      auto* body = llvm::BasicBlock::Create(context_, "tile.body", fn_);
      b_.CreateCondBr(b_.CreateICmpSLT(r, chunkEnd), body, exit);
      b_.SetInsertPoint(body);
      prefetchRows(rowOperands, r, b_.CreateSub(chunkEnd, constant(1)),
                   b_.CreateMul(blk, constant(packed.width)), tileRows);
      llvm::Value* height =
          b_.CreateSelect(
              b_.CreateICmpSLT(r, split.fullEnd), constant(shapes.full),
              b_.CreateSelect(b_.CreateICmpSLT(r, split.shortenedEnd), constant(shapes.shortened),
                              b_.CreateSelect(b_.CreateICmpSLT(r, split.shorterEnd),
                                              constant(shapes.shorter),
                                              b_.CreateSub(chunkEnd, r))),
              "height");
      // One block per tile variant the policy uses; any other height is cut into half tiles,
      // then single rows.
      auto* lastRows = llvm::BasicBlock::Create(context_, "last_rows", fn_);
      auto* computed = llvm::BasicBlock::Create(context_, "tile_computed", fn_);
      llvm::SwitchInst* byHeight = b_.CreateSwitch(height, lastRows, 3);
      for (auto [rows, own] : {std::pair{shapes.full, true},
                               std::pair{shapes.shortened, shapes.hasShortened()},
                               std::pair{shapes.shorter, shapes.hasShorter()}}) {
        if (!own)
          continue;
        auto* tile = llvm::BasicBlock::Create(context_, "tile_" + std::to_string(rows), fn_);
        byHeight->addCase(b_.getInt64(static_cast<uint64_t>(rows)), tile);
        b_.SetInsertPoint(tile);
        storeTile(emitTile(x, weights, packed, blk, r, rows), constant(0));
        b_.CreateBr(computed);
      }
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
      r->addIncoming(b_.CreateAdd(r, height), b_.GetInsertBlock());
      b_.CreateBr(header);
      b_.SetInsertPoint(exit);
    });
  };

  // The tiles read copies of the rows of x (PackedProduct::xBuffer), each thread its own.
  const View source = x;
  llvm::Value* rowsPerThread = packed.splitRows ? constant(packed.chunkRows) : batchRows;
  llvm::Value* copies =
      b_.CreateGEP(f32_, buffers_[packed.xBuffer],
                   b_.CreateMul(b_.CreateMul(thread_, rowsPerThread), constant(packed.xStride)),
                   "x_copies");
  if (!packed.splitRows) { // the recurrent product: this thread's columns of every row
    x = View{copies, constant(packed.xStride)};
    copyRows(x, source, {constant(0), batchRows}, packed.depth);
    return chunk(constant(0), batchRows, share(constant(packed.blocks)));
  }
  RowRange mine = share(batchRows);
  RowRange allBlocks{constant(0), constant(packed.blocks)};
  forLoop(mine.begin, mine.end, constant(packed.chunkRows), "chunk", [&](llvm::Value* begin) {
    llvm::Value* end = b_.CreateAdd(begin, constant(packed.chunkRows));
    end = b_.CreateSelect(b_.CreateICmpSLT(end, mine.end), end, mine.end);
    // The chunk's rows, addressed by their row numbers.
    x = View{b_.CreateGEP(f32_, copies, b_.CreateNeg(b_.CreateMul(begin, constant(packed.xStride)))),
             constant(packed.xStride)};
    copyRows(x, source, {begin, end}, packed.depth);
    chunk(begin, end, allBlocks);
  });
}

// Asks for the lines the epilogue of the tile at firstRow will read (the premultiplied input
// rows above all: written by the input GEMM long before, and in DRAM by now when the sequence's
// rows outgrow the L3), so that they arrive while the tile's depth loop runs, thousands of
// cycles of FMAs that read only the weights and x (GRU at I=H=1024: 3% faster). Rows past
// lastRow ask for lastRow's line again rather than for memory past the batch.
void Emitter::prefetchRows(const std::vector<const ir::Value*>& operands, llvm::Value* firstRow,
                           llvm::Value* lastRow, llvm::Value* column, int64_t rows) {
  for (const ir::Value* operand : operands) {
    View v = view(operand);
    for (int64_t m = 0; m < rows; ++m) {
      llvm::Value* row = b_.CreateAdd(firstRow, constant(m));
      row = b_.CreateSelect(b_.CreateICmpSLT(row, lastRow), row, lastRow);
      // A read, to be kept close (locality 3: into L1), of data.
      b_.CreateIntrinsic(
          llvm::Intrinsic::prefetch, {ptr_},
          {elementPointer(v, row, column), b_.getInt32(0), b_.getInt32(3), b_.getInt32(1)});
    }
  }
}

// Rows [firstRow, firstRow + rows) of x times block `blk` of the packed weights. The slices
// are accumulated in passes of as many as the tile's accumulators allow for this many rows
// (a panel for a full tile, all of them for one row); each pass is one walk over the depth.
Emitter::Tile Emitter::emitTile(const View& x, llvm::Value* weights, const PackedProduct& packed,
                                llvm::Value* blk, llvm::Value* firstRow, int64_t rows) {
  const int64_t slices = packed.slices();
  // As many slices per pass as the full tile's accumulators allow for this many rows, and
  // as the registers hold with each slice's weights and the broadcast input beside them (3
  // rows x 4 slices is 17 registers of AVX2's 16: LLVM spilled accumulators in the depth
  // loop, which ran at less than half speed); the slices then split evenly between passes.
  const int64_t accumulators = packed.tileRows * packed.panelSlices;
  const int64_t vectorsPerSlice = std::max<int64_t>(1, packed.width / target_.vectorWidth);
  const int64_t fitting =
      std::min(accumulators / rows, (target_.vectorRegisters - 1) / (vectorsPerSlice * (rows + 1)));
  const int64_t passes =
      (slices + std::max<int64_t>(fitting, 1) - 1) / std::max<int64_t>(fitting, 1);
  const int64_t perPass = (slices + passes - 1) / passes;
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
    auto [k, header, exit] = openLoop(constant(0), "depth");
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

} // namespace rnnc::codegen

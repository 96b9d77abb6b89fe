// A product's item on a block of threads that stage chunks of x and of the packed weights in
// shared memory (PackedProduct::blockTiled). Part of the GPU lowering: codegen/GpuRegionEmitter.h.
#include "codegen/GpuRegionEmitter.h"

#include <array>
#include <cstddef>

namespace rnnc::codegen {

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

} // namespace rnnc::codegen

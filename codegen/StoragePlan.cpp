#include "codegen/StoragePlan.h"

#include "codegen/CacheLines.h"
#include "codegen/RunArgs.h"
#include "ir/Error.h"
#include "ir/ShapeInference.h"

#include <algorithm>

namespace rnnc::codegen {
namespace {

// Whether an instruction's result is read by anything outside its own kernel: an instruction
// elsewhere, the output, or (with `countUpdates`) a state update.
bool usedOutsideKernel(const ir::Cell& cell, const ir::Instr& instr, bool countUpdates = true) {
  if (cell.output == &instr.result)
    return true;
  if (countUpdates)
    for (const ir::StateUpdate& update : cell.updates)
      if (update.next == &instr.result)
        return true;
  for (const ir::Block* block : {&cell.pre, &cell.step})
    for (const auto& user : *block)
      for (const ir::Value* operand : user->operands)
        if (operand == &instr.result && (instr.kernel < 0 || user->kernel != instr.kernel))
          return true;
  return false;
}

} // namespace

bool isViewOrImmediate(const ir::Value* value) {
  return !value->isArgument() &&
         (value->def->op == ir::Op::Slice || value->def->op == ir::Op::Const);
}

// The argument a value reads, looking through slices; null if it is not a view of an argument.
const ir::Value* viewedArgument(const ir::Value* value) {
  while (!value->isArgument() && value->def->op == ir::Op::Slice)
    value = value->def->operands[0];
  return value->isArgument() ? value : nullptr;
}

// Whether update `u` can be stored over its state by the kernel that computes it (see
// StoragePlan::updatedInKernel).
bool canUpdateInKernel(const ir::Cell& cell, const ir::StateUpdate& u) {
  const ir::Value* next = u.next;
  if (next->isArgument() || next->def->kernel < 0 || next->shape != u.state->shape)
    return false;
  // A kernel stores what it computes; a view (a chunk read raw) or a constant it only reads.
  if (ir::isView(next->def->op) || next->def->op == ir::Op::Const)
    return false;
  const int kernel = next->def->kernel;
  // Position of the kernel's first instruction in the step block.
  size_t start = cell.step.size();
  for (size_t i = 0; i < cell.step.size(); ++i)
    if (cell.step[i]->kernel == kernel) {
      start = i;
      break;
    }
  if (start == cell.step.size())
    return false; // a pre-block kernel
  // The kernel loads an operand where it is first needed and stores the next value where it is
  // computed, so every read of the state must come no later than that store.
  size_t store = start;
  while (&cell.step[store]->result != next)
    ++store;
  for (size_t i = start; i < cell.step.size(); ++i)
    for (const ir::Value* operand : cell.step[i]->operands)
      if (operand == u.state &&
          (cell.step[i]->kernel != kernel || !ir::isElementwise(cell.step[i]->op) || i > store))
        return false; // read after the kernel, after the store, or at another column (slice)
  // The end of the step must not read the old state either: as the output or another update.
  if (viewedArgument(cell.output) == u.state)
    return false;
  for (const ir::StateUpdate& other : cell.updates)
    if (&other != &u && viewedArgument(other.next) == u.state)
      return false;
  return true;
}

KernelSpace kernelSpace(const ir::Block& block, const KernelGroup& group) {
  ir::Shape space;
  for (size_t i = group.first; i < group.last; ++i) {
    if (block[i]->op == ir::Op::LayerNorm)
      continue; // normalised on the fly: it does not set the iteration space
    auto widened = ir::broadcastShapes(space, block[i]->result.shape);
    RNNC_INTERNAL_CHECK(widened.has_value(), "kernel members do not share an iteration space");
    space = *widened;
  }
  KernelSpace result;
  result.batched = ir::hasBatch(space);
  for (size_t d = 0; d + 1 < space.size(); ++d)
    if (!result.batched)
      result.fixedRows *= space[d].constantValue();
  result.cols = space.empty() ? 1 : space.back().constantValue();
  for (size_t i = group.first; i < group.last; ++i)
    result.normalises |= block[i]->op == ir::Op::LayerNorm;
  return result;
}

std::vector<std::vector<const ir::Value*>>
sliceValuesOf(const ir::Block& block, const KernelGroup* group, const PackedProduct& packed) {
  const ir::Instr& product = *packed.product;
  std::vector<std::vector<const ir::Value*>> values(static_cast<size_t>(packed.slices()));
  if (!group) {
    values[0].push_back(&product.result);
    return values;
  }
  for (size_t i = group->first + 1; i < group->last; ++i) {
    const ir::Instr& instr = *block[i];
    if (instr.op != ir::Op::Slice || instr.operands[0] != &product.result)
      continue;
    auto at =
        std::find(packed.offsets.begin(), packed.offsets.end(), instr.attrs.offset.constantValue());
    values[static_cast<size_t>(at - packed.offsets.begin())].push_back(&instr.result);
  }
  return values;
}

std::vector<WorkUnit> workUnits(const ir::Block& block, const StoragePlan& plan) {
  std::vector<WorkUnit> units;
  std::vector<KernelGroup> groups = kernelGroups(block);
  size_t nextGroup = 0;
  for (size_t i = 0; i < block.size();) {
    WorkUnit unit{i, i + 1};
    unit.kernel = nextGroup < groups.size() && groups[nextGroup].first == i;
    if (unit.kernel)
      unit.last = groups[nextGroup++].last;
    i = unit.last;
    bool viewsOnly = true;
    for (size_t j = unit.first; j < unit.last; ++j)
      viewsOnly &= block[j]->op == ir::Op::Const || block[j]->op == ir::Op::Slice;
    if (viewsOnly)
      continue;
    unit.packed = plan.packedProductOf(block[unit.first].get());
    unit.unbatched = !unit.packed;
    for (size_t j = unit.first; j < unit.last; ++j)
      if (block[j]->op != ir::Op::Const && block[j]->op != ir::Op::Slice)
        unit.unbatched &= !block[j]->result.isBatched();
    units.push_back(unit);
  }
  return units;
}

const PackedProduct* StoragePlan::packedProductOf(const ir::Instr* product) const {
  for (const PackedProduct& packed : packedProducts)
    if (packed.product == product)
      return &packed;
  return nullptr;
}

namespace {

// A GPU block tile (PackedProduct::blockTiled): over the sequence's rows, blocks of 256 threads
// in 16 x 16, each 4 rows by as many columns as make 8 sums (of every slice): 64 rows by
// 16 * columns per block, the tile of a classic SIMT SGEMM, 32 accumulators for an LSTM.
// In a step (B rows, a few dozen): groups of 64 threads in 4 x 16, each 4 rows by as many
// columns as make 4 sums, 4 groups splitting the depth: 16 rows, so that a batch of 64 makes
// 4 row tiles by H / 16 column blocks (128 blocks of 8 warps for H = 512 on a GPU of 132
// multiprocessors). On an H200, default LSTM, per step / persistent ms in one session: this
// 1.73 / 1.61; 8 x 8 threads (32 rows by 8 columns) 1.78 / 1.81; 2 x 16 1.82 / 1.87; 8 depth
// groups 1.80 / 1.72, 2 groups 2.10 / 2.32; one group of 8 x 8, 2.50 / 2.36 (18 us a step).
// More slices than the sums allow take one column each, fewer rows past 8 slices.
// With tensor cores (Target::tensorCores) the same block on MMA tiles, where it is whole ones
// (bench/gpu-notes.md: the default LSTM 1.35 -> 1.25 ms persistent on an H200).
void planGpuBlockTiles(PackedProduct& packed, bool step, bool tensorCores) {
  const int64_t slices = packed.slices();
  const int64_t rowThreads = step ? 4 : 16, columnThreads = 16;
  const int64_t sums = step ? 4 : 8;
  packed.blockTiled = true;
  packed.depthGroups = step ? 4 : 1;
  packed.blockThreads = packed.depthGroups * rowThreads * columnThreads;
  packed.threadColumns = std::max<int64_t>(1, sums / slices);
  packed.threadRows = slices <= 8 ? 4 : std::max<int64_t>(1, 32 / slices);
  packed.tileRows = rowThreads * packed.threadRows;
  packed.width = columnThreads * packed.threadColumns;
  packed.depthChunk = 16;
  if (!tensorCores)
    return;
  // Tensor cores where the tile is whole 16-row by 8-column MMA tiles, shared between a group's
  // warps: of the ways to deal them, the one whose warps load the fewest fragments per MMA.
  const int64_t warps = packed.blockThreads / packed.depthGroups / kGpuWarpLanes;
  const int64_t rowTiles = packed.tileRows / 16, columnTiles = packed.width * slices / 8;
  if (packed.tileRows % 16 != 0 || (packed.width * slices) % 8 != 0)
    return;
  double bestLoads = 0;
  for (int64_t warpsDown = 1; warpsDown <= warps; ++warpsDown) {
    if (warps % warpsDown != 0 || rowTiles % warpsDown != 0 ||
        columnTiles % (warps / warpsDown) != 0)
      continue;
    const int64_t down = rowTiles / warpsDown, across = columnTiles / (warps / warpsDown);
    const double loads = static_cast<double>(4 * down + 2 * across) / (down * across);
    if (!packed.tensorCores || loads < bestLoads) {
      packed.tensorCores = true;
      packed.warpTileRows = down;
      packed.warpTileColumns = across;
      bestLoads = loads;
    }
  }
}

PackedProduct planPackedProduct(const ir::Cell& cell, const ir::Block& block,
                                const ir::Instr& product, const Target& target, WeightType weights,
                                int64_t gpuStepTileRows) {
  const int64_t vectorWidth = target.vectorWidth;
  PackedProduct packed;
  packed.product = &product;
  packed.weights = weights;
  packed.splitRows = &block == &cell.pre; // see "How the work is split" in StoragePlan.h
  if (packed.standalone()) {              // one slice of all its columns
    packed.offsets.push_back(0);
    packed.columns = columnsOf(&product.result);
  }
  for (const auto& user : block)
    if (!packed.standalone() && user->op == ir::Op::Slice && user->operands[0] == &product.result) {
      int64_t offset = user->attrs.offset.constantValue();
      if (std::find(packed.offsets.begin(), packed.offsets.end(), offset) == packed.offsets.end())
        packed.offsets.push_back(offset);
      packed.columns = columnsOf(&user->result);
    }
  RNNC_INTERNAL_CHECK(!packed.offsets.empty(), "a fused product that no slice reads");
  packed.depth = columnsOf(product.operands[0]);
  if (target.isGpu()) {
    // Over the sequence's rows (the input projection) and in a step of a large batch, block
    // tiles through shared memory; in a step of a small batch, a warp per column (splitDepth),
    // every slice in one panel.
    packed.panelSlices = packed.passSlices = packed.slices();
    const bool step = &block == &cell.step;
    if (step && gpuStepTileRows != kGpuStepBlockTiles) {
      packed.width = kGpuBlockColumns;
      packed.splitDepth = true;
      packed.tileRows = gpuStepTileRows;
    } else {
      planGpuBlockTiles(packed, step, target.tensorCores);
    }
    packed.blocks = (packed.columns + packed.width - 1) / packed.width;
    return packed;
  }
  packed.amxTiles = vectorWidth == 16 && target.has("amx-tile") &&
                    ((weights == WeightType::BF16 && target.has("amx-bf16")) ||
                     (weights == WeightType::I8 && target.has("amx-int8")));
  packed.depthPairs =
      weights == WeightType::BF16 && (packed.amxTiles || target.pairsBf16Products());
  packed.width = vectorWidth;
  packed.blocks = (packed.columns + vectorWidth - 1) / vectorWidth;
  // Accumulators: every vector register but one for the broadcast input and a few for the
  // weights (AVX2: 12 of 16; AVX-512: 28 of 32). Up to three slices go in one pass (a GRU's
  // 4 rows x 3 slices); more in passes of two (an LSTM's 6 x 2, the classic 6x16 SGEMM tile).
  // Three slices as a pass of two and a pass of one would leave the second pass with 6
  // accumulators, too few chains to cover the FMA latency (GRU: 4% slower).
  // int8 tiles hold two more: the 16-bit products of a multiply and the ones that add them.
  const int64_t accumulators = target.vectorRegisters - (weights == WeightType::I8 ? 6 : 4);
  packed.passSlices = packed.slices() <= 3 ? packed.slices() : 2;
  packed.tileRows = accumulators / packed.passSlices;
  // A step's fp32 products keep all their slices in one panel, each depth's weights of every
  // slice side by side: at batch 1 a step is a row times all of W_hh, walked in one pass, and
  // one stream of lines is read from L2 faster than one per panel, 16 KB apart (LSTM, 4 slices
  // at H = 256, two panels: AVX2 GEMV 105 -> 160 GB/s from L2 on Zen 5; the step 5-10% faster,
  // rnnc bench --batch 1 --input 256 --hidden 256). A full tile's pass then reads `passSlices`
  // of each depth's, a stride the prefetchers follow (batch 64: the same or 2% faster).
  // fp16 and bf16 weights do so where the step's weights are past L2, read from L3 faster as one
  // stream too (LSTM at I = H = 512, batch 1, W_hh 2 MB, Zen 5: fp16 widened as it is loaded,
  // the step 1.63x -> 1.85x faster than fp32's, by their shares of `perf` samples in one
  // process; bf16 pairs, the run 2.02x -> 2.16x fp32's speed, medians of 10 alternating
  // processes); within L2 their panels of a pass were 2-3% faster (fp16 at H = 256: 1.59x and
  // 1.58x fp32's step, against 1.55x and 1.55x as one panel). Products over the sequence (split
  // rows), int8 tiles (no faster as one panel at H = 1024) and AMX tiles keep panels of a pass.
  const bool halfWidth =
      (weights == WeightType::F16 || weights == WeightType::BF16) && !packed.amxTiles;
  const bool oneStream =
      weights == WeightType::F32 || (halfWidth && packed.packedBytes() > target.l2Bytes);
  packed.panelSlices = !packed.splitRows && oneStream ? packed.slices() : packed.passSlices;
  if (packed.slices() == 1) {
    // One slice over many rows (the input projection over T*B rows, an unfused product): the
    // classic SGEMM tile, 2 vectors wide and as many rows as the accumulators allow (AVX2 6x16,
    // AVX-512 14x32): 2 weight loads and one broadcast per row for every 2 FMAs of a row.
    // One slice of the recurrent product (a vanilla RNN, a backward's dgates W_hh): blocks of 4
    // vectors (a power of two: LLVM scalarises parts of the elementwise code on 3-vector types)
    // where L1 holds the block, in tiles of as many rows as the registers hold beside the 4
    // weight vectors and the broadcast input: with 32 registers 6 rows (24 accumulators), with
    // AVX2's 16 only 2, each weight vector then feeding 2 FMAs. Each pair of rows reads the
    // block from L1 then, and at batch 1 a broadcast per 4 FMAs rather than per 2 keeps the
    // loads down (2 vectors took 11% longer, AVX2 on Zen 5, H = 256). Where L1 does not hold it
    // (32 KB, every x86-64 core we run on has at least that), the tile streams it from L2, a
    // vector per as many FMAs as the tile has rows, and takes the SGEMM tile: AVX2's 2 x 4 read
    // one per 2 FMAs, and a GRU's backward step ran at 73% of the FMA peak; AVX-512's 6 x 4 one
    // per 6, and an LSTM's backward dgates W_hh (depth 2048: a 512 KB block) took 5-8% more of
    // the time beside the weight gradients' GEMMs in `perf` samples than at 14 x 2 (Intel Xeon;
    // a vanilla RNN's step at H = 512 and 256, whose blocks are 128 and 64 KB, ran as fast).
    // int8 tiles keep their own shape.
    constexpr int64_t kL1Bytes = 32 * 1024;
    const bool blockInL1 = packed.depth * 4 * vectorWidth * weightTypeBytes(weights) <= kL1Bytes;
    const int64_t vectors = packed.splitRows || (!blockInL1 && weights != WeightType::I8) ? 2 : 4;
    packed.width = vectors * vectorWidth;
    packed.blocks = (packed.columns + packed.width - 1) / packed.width;
    packed.tileRows = std::max<int64_t>(
        1, std::min(accumulators, target.vectorRegisters - 1 - vectors) / vectors);
  }
  if (packed.amxTiles) { // two A tiles of rows per weight tile (codegen/AmxTiles.cpp), and
    // blocks of at most two sum tiles, so that 2 x 2 of them fit the 8 tile registers
    packed.tileRows = 2 * kAmxTileRows;
    packed.width = std::min<int64_t>(packed.width, 2 * vectorWidth);
    packed.blocks = (packed.columns + packed.width - 1) / packed.width;
  }
  if (packed.splitRows) {
    // Half of L2 for the chunk's rows of x (K floats each), the rest for the block of weights
    // passing over them and the rows written.
    const int64_t rowBytes = packed.depth * static_cast<int64_t>(sizeof(float));
    // At most 256 rows: a few hundred rows already reuse each block of weights enough, and
    // each thread keeps a copy of its chunk's rows.
    const int64_t fitting =
        std::min<int64_t>(256, target.l2Bytes / 2 / std::max<int64_t>(rowBytes, 1));
    packed.chunkRows = std::max<int64_t>(1, fitting / packed.tileRows) * packed.tileRows;
  }
  return packed;
}

} // namespace

int64_t PackedProduct::panelWidth(int64_t slice) const {
  int64_t first = slice / panelSlices * panelSlices;
  return std::min(panelSlices, slices() - first) * width;
}

int64_t PackedProduct::sliceStart(int64_t slice) const {
  int64_t first = slice / panelSlices * panelSlices;
  return first * packedDepth() * width + (slice - first) * width;
}

namespace {

// A matrix product planStorage packs the weights of (a PackedProduct): one fused into a kernel,
// or one whose weights are parameters.
bool packsWeights(const ir::Cell& cell, const ir::Instr& instr) {
  return ir::isMatrixProduct(instr.op) &&
         (instr.kernel >= 0 || ir::hasPackableWeights(cell, instr));
}

// Whether the step's packed products have fp32 weights that fit in half of the target's L2, with
// room for the rows they multiply and the rest of the step's data.
bool stepWeightsFitHalfOfL2(const ir::Cell& cell, const Target& target) {
  int64_t bytes = 0;
  for (const auto& instr : cell.step)
    if (packsWeights(cell, *instr))
      bytes += columnsOf(instr->operands[0]) * columnsOf(&instr->result) *
               static_cast<int64_t>(sizeof(float));
  return bytes > 0 && bytes <= target.l2Bytes / 2;
}

// Where each part of `concat`, starting at `column` of the output rows, is stored: a batched
// value in the columns of its first place (where it appears again, the concat copies it there),
// and the parts of a concat within it in turn (a backward's output [dgates_x | dgates_h] of
// concats that share gates: the GRU's dr and dz in both). A value placed here that the loop
// computes is stored straight into its columns by the kernel that computes it.
void placeConcatParts(const ir::Instr& concat, int64_t column,
                      std::unordered_map<const ir::Value*, int64_t>& places) {
  for (const ir::Value* part : concat.operands) {
    if (part->isBatched() && places.try_emplace(part, column).second && !part->isArgument() &&
        part->def->op == ir::Op::Concat)
      placeConcatParts(*part->def, column, places);
    column += columnsOf(part);
  }
}

// The copies of x of products whose depths are within a factor of two of the deepest's take
// its row stride, so that their tiles can share one walk over the depth (ProductKernelEmitter:
// a walk's depth is an argument, its rows' distance a constant): an LSTM with I = 256 and
// H = 512 has one walk instead of two. Rows further apart stay in different sets of L1; the
// lines a row uses are as many. Tiles that are not walks (int8, bf16 pairs, AMX) keep theirs.
void shareRowStrides(StoragePlan& plan) {
  auto walks = [](const PackedProduct& p) {
    return p.xStride > 0 && p.weights != WeightType::I8 && !p.depthPairs && !p.amxTiles;
  };
  int64_t deepest = 0;
  for (const PackedProduct& p : plan.packedProducts)
    if (walks(p))
      deepest = std::max(deepest, p.depth);
  for (PackedProduct& p : plan.packedProducts)
    if (walks(p) && 2 * p.depth >= deepest) {
      p.xStride = oddLinesApart(deepest);
      plan.buffers[p.xBuffer].cols = p.xStride;
    }
}

} // namespace

StoragePlan planStorage(const ir::Cell& cell, const Target& target, WeightType weights,
                        int64_t gpuStepTileRows, bool widenCachedFp16) {
  // fp16 weights are widened by F16C's vcvtph2ps (every x86-64 CPU with AVX2 has it); without it
  // LLVM would call a conversion routine the JIT does not link.
  if (weights == WeightType::F16 && !target.has("f16c"))
    throw UserError("fp16 weights need F16C, which CPU '" + target.cpu +
                    "' lacks: use bf16 weights there");
  // The int8 products multiply with AVX2's vpmaddubsw and vpmaddwd, 8 columns at a time.
  if (weights == WeightType::I8 && !target.has("avx2"))
    throw UserError("int8 weights need AVX2, which CPU '" + target.cpu + "' lacks");
  if (target.isGpu() && weights != WeightType::F32)
    throw UserError(std::string(weightTypeName(weights)) +
                    " weights are not generated for GPUs yet: use fp32 there");
  StoragePlan plan;
  // An output that concatenates values the step computes: they are stored straight into their
  // columns (a CPU's kernels store through any row stride; placeConcatParts); the loop below
  // takes only step values that would otherwise get a buffer of their own.
  std::unordered_map<const ir::Value*, int64_t> outputParts;
  const ir::Instr* outputDef = cell.output->isArgument() ? nullptr : cell.output->def;
  if (!target.isGpu() && outputDef && outputDef->op == ir::Op::Concat)
    placeConcatParts(*outputDef, 0, outputParts);
  const bool widenStep = weights == WeightType::F16 && widenCachedFp16 && !target.isGpu() &&
                         !target.widensFp16BesideFmas() && stepWeightsFitHalfOfL2(cell, target);
  for (const ir::Block* block : {&cell.pre, &cell.step}) {
    bool inPre = block == &cell.pre;
    const bool widened = !inPre && widenStep;
    for (const auto& instr : *block) {
      const ir::Value* value = &instr->result;
      if (isViewOrImmediate(value))
        continue;
      bool kernelInternal =
          (ir::isFusible(instr->op) || instr->kernel >= 0) && !usedOutsideKernel(cell, *instr);
      if (packsWeights(cell, *instr)) {
        PackedProduct packed = planPackedProduct(
            cell, *block, *instr, target, widened ? WeightType::F32 : weights, gpuStepTileRows);
        if (widened)
          packed.widenedFrom = WeightType::F16;
        packed.buffer = plan.buffers.size();
        plan.buffers.push_back({value, Rows::Fixed, packed.blocks * packed.packedDepth(),
                                packed.slices() * packed.width,
                                /*packedWeights=*/true, packed.packedElementBytes()});
        if (weights == WeightType::I8) {
          packed.scaleBuffer = plan.buffers.size();
          plan.buffers.push_back(
              {value, Rows::Fixed, packed.blocks, packed.slices() * packed.width * 2, true});
        }
        // A GPU tile reads its rows of x where they are; a CPU tile from a copy:
        if (!target.isGpu()) {
          // Consecutive rows, as many as a tile has, start in different sets of L1.
          packed.xStride = oddLinesApart(packed.depth);
          packed.xBuffer = plan.buffers.size();
          plan.buffers.push_back({value, packed.splitRows ? Rows::PerThread : Rows::PerThreadStep,
                                  packed.splitRows ? packed.chunkRows : 0, packed.xStride});
        }
        plan.packedProducts.push_back(std::move(packed));
      }
      // A next state stored over the state by its kernel needs no buffer of its own, unless
      // something besides the update reads it outside the kernel: another update too (one
      // value the next value of two states, one of which the kernel cannot store over).
      bool nextState = false, everyUpdateInKernel = true;
      for (const ir::StateUpdate& update : cell.updates)
        if (update.next == value) {
          nextState = true;
          everyUpdateInKernel &= canUpdateInKernel(cell, update);
        }
      if (nextState && everyUpdateInKernel &&
          !usedOutsideKernel(cell, *instr, /*countUpdates=*/false))
        kernelInternal = true;
      if (kernelInternal)
        continue;
      if (!inPre && value == cell.output) {
        plan.outputInPlace = true;
        continue;
      }
      if (auto part = outputParts.find(value); !inPre && part != outputParts.end()) {
        plan.inOutputColumns[value] = part->second;
        continue;
      }
      Rows rows = !value->isBatched() ? Rows::Fixed : inPre ? Rows::Sequence : Rows::Step;
      plan.bufferOf[value] = plan.buffers.size();
      plan.buffers.push_back(
          {value, rows, rows == Rows::Fixed ? fixedRowsOf(value) : 0, columnsOf(value)});
    }
  }
  for (const ir::StateUpdate& update : cell.updates) {
    const ir::Value* source = viewedArgument(update.next);
    bool readsState = source && source->argKind == ir::ArgKind::State && source != update.state;
    plan.staging.push_back(readsState ? static_cast<int>(plan.buffers.size()) : -1);
    plan.updatedInKernel.push_back(canUpdateInKernel(cell, update));
    const bool wholeOutput =
        update.next == cell.output && update.state->shape == cell.output->shape;
    const auto inColumns = plan.inOutputColumns.find(update.next);
    const bool outputColumns =
        inColumns != plan.inOutputColumns.end() && update.state->shape == update.next->shape;
    const bool fromOutput = (wholeOutput || outputColumns) && update.next != update.state &&
                            !readsState && !plan.updatedInKernel.back();
    plan.readFromOutput.push_back(fromOutput);
    plan.readFromOutputColumn.push_back(fromOutput && !wholeOutput ? inColumns->second : 0);
    if (readsState)
      plan.buffers.push_back({update.next, Rows::Step, 1, columnsOf(update.next)});
  }
  shareRowStrides(plan);
  // Reduced weights on a cell without a product whose weights are parameters would quietly
  // change nothing.
  if (weights != WeightType::F32 && plan.packedProducts.empty())
    throw UserError("cell '" + cell.name + "' has no linear or matmul with parameter weights: " +
                    std::string(weightTypeName(weights)) + " weights would change nothing");
  return plan;
}

std::vector<int64_t> packLayout(const PackedProduct& packed) {
  std::vector<int64_t> fields(RNNC_PACK_FIELDS);
  fields[RNNC_PACK_WEIGHT_TYPE] = static_cast<int64_t>(packed.weights);
  fields[RNNC_PACK_TRANSPOSED] = packed.product->op == ir::Op::Linear; // x @ W^T: W is [N, K]
  fields[RNNC_PACK_DEPTH_PAIRS] = packed.depthPairs;
  fields[RNNC_PACK_WIDTH] = packed.width;
  fields[RNNC_PACK_BLOCKS] = packed.blocks;
  fields[RNNC_PACK_COLUMNS] = packed.columns;
  fields[RNNC_PACK_DEPTH] = packed.depth;
  fields[RNNC_PACK_PACKED_DEPTH] = packed.packedDepth();
  fields[RNNC_PACK_SLICES] = packed.slices();
  fields[RNNC_PACK_WIDENED_FROM] = static_cast<int64_t>(packed.widenedFrom);
  for (int64_t s = 0; s < packed.slices(); ++s)
    for (int64_t v :
         {packed.offsets[static_cast<size_t>(s)], packed.sliceStart(s), packed.panelWidth(s)})
      fields.push_back(v);
  return fields;
}

} // namespace rnnc::codegen

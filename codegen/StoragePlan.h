// Where every value of an optimised cell lives when the generated code runs:
//   - arguments: the caller's params, inputs (read per step) and states;
//   - constants: immediates; slices: views (an offset into what they slice);
//   - values made and used inside one fused kernel: registers only;
//   - everything else: a buffer the runtime allocates, with T*B rows (pre), B rows (step) or
//     one row (no batch dimension). The step's output value is written straight into the output
//     sequence instead of a buffer.
// No LLVM here: the runtime reads the plan to allocate, the emitter to address.
#pragma once

#include "codegen/Target.h"
#include "codegen/WeightType.h"
#include "ir/Cell.h"
#include "ir/KernelGroups.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

namespace rnnc::codegen {

// An AMX tile's rows (16 at most), and the 32-bit words of depth in an A tile's row (64 bytes:
// 16 bf16 pairs, or 16 groups of 4 int8): one tdpbf16ps multiplies 16 rows by 32 depths by 16
// columns, one tdpbusd 16 rows by 64 depths by 16 columns.
constexpr int64_t kAmxTileRows = 16;
constexpr int64_t kAmxTileWords = 16;

// T*B, B, a fixed count; or, for each thread, a fixed count or B (thread t's part starts at row
// t * fixedRows, or t * B).
enum class Rows { Sequence, Step, Fixed, PerThread, PerThreadStep };

struct BufferSpec {
  const ir::Value* value;
  Rows rows;
  int64_t fixedRows; // the row count when rows == Fixed (1 for a vector)
  int64_t cols;
  bool packedWeights = false; // a fused product's packed weights, not `value` itself
  // Bytes per element: 2 for packed weights of fp16 or bf16. The runtime allocates floats, so
  // a buffer of 2-byte elements takes half as many (rounded up).
  int64_t elementBytes = 4;
  // How many floats the buffer's `rows` rows take.
  int64_t floatsFor(int64_t rows) const { return (rows * cols * elementBytes + 3) / 4; }
};

// A matrix product computed by generated code in register tiles, from weights packed once by the
// parameter phase: fused into the kernel that reads it (passes/FuseMatMul.h), whose elementwise
// work then runs on each tile, or standalone, its tiles stored to its buffer. It is computed in
// tiles of `tileRows` rows by one block of `width` columns of each slice the kernel reads (a
// standalone product: one slice of all its columns), the slices accumulated `passSlices` at a
// time (as many as fit in registers for a full tile). Its weights are packed in panels of
// `panelSlices` slices: block after block, panel after panel, depth after depth, `width` weights
// of each of the panel's slices (zero past the kernel's columns). A full tile's pass reads
// `passSlices` of each depth's; a single row (batch 1) takes every slice in one pass, and a
// step's product keeps every slice in one panel so that the row reads one stream (below).
//
// How the work is split: a product in the step (the recurrent product, fused or standalone, as a
// backward step's dgates W_hh) gives each thread a fixed share of the column blocks for the whole
// sequence, so that its weights stay in its cache and B rows need not divide into tiles evenly
// (B = 64 in 14-row tiles gave one thread 42 rows, the other 22); a product in `pre` (the input
// projection over T*B rows above all) gives each thread its rows, in chunks of `chunkRows` rows
// that stay in L2 while every block of weights passes over them.
// (Walking the depth in blocks whose panels stay in L1, as BLIS does, gained nothing measurable:
// the panel's lines stream from L2 fast enough for 2 loads per row of FMAs.)
struct PackedProduct {
  const ir::Instr* product;
  size_t buffer;                // index into StoragePlan::buffers
  std::vector<int64_t> offsets; // the column offset of each slice the kernel reads
  int64_t width = 0;            // columns per block
  int64_t blocks = 0;           // ceil(kernel columns / width)
  int64_t columns = 0;          // the kernel's columns
  int64_t depth = 0;            // K, the product's inner dimension
  int64_t tileRows = 1;
  int64_t panelSlices = 1;
  int64_t passSlices = 1;
  WeightType weights = WeightType::F32; // how the packed weights are stored
  // fp16 weights stored as fp32: each weight rounded to fp16, then widened once, at packing (so
  // the sums are the fp16 tiles' own). Where a step's fp32 weights fit in half of one core's L2
  // (planStorage's widenCachedFp16), its tiles read them from L2 faster than they widen fp16:
  // vcvtph2ps shares the FMA's ports on Intel's cores and takes two cycles a zmm on Zen 4
  // (`rnnc_bench --benchmark_filter=weightGemv`: 1M weights from L2 in 15.6 us as fp16 and
  // 9.5 us as fp32 on an Intel Xeon, where an LSTM at H = 256 and batch 1 ran 0.69-0.87x
  // fp32's speed with fp16 tiles). WeightType::F32 where not widened.
  WeightType widenedFrom = WeightType::F32;
  // int8: per block, each slice's `width` dequantization scales then its `width` column sums
  // of the quantized weights (fp32; the sums correct for the input's zero point).
  size_t scaleBuffer = 0;
  // bf16 where vdpbf16ps is the faster (Target::pairsBf16Products): the weights of two consecutive
  // depths in one 32-bit element (the lower depth in the low half, zero past the depth), what
  // vdpbf16ps multiplies with the row's pair of inputs, themselves rounded to bf16 as they are
  // copied for the tiles.
  bool depthPairs = false;
  // bf16 on a CPU with AMX-BF16, int8 on one with AMX-INT8: the products on its tiles
  // (tdpbf16ps, tdpbusd; codegen/AmxTiles.cpp), the weights packed as above (pairs, groups of 4),
  // the packed depth padded to whole tiles of 16 words (zero weights; zero bf16 inputs in the
  // rows' copies, whatever int8 ones); tiles of 2 x kAmxTileRows rows.
  bool amxTiles = false;
  bool splitRows = false; // threads split rows (in chunks), not column blocks
  int64_t chunkRows = 0;  // with splitRows: rows per chunk, a multiple of tileRows
  // The rows of x are first copied into this thread's part of buffer `xBuffer` (each chunk's
  // rows of a row-split product: PerThread, chunkRows rows; all B rows of the recurrent product
  // at each step: PerThreadStep), with a row stride of `xStride` floats that no two rows of a
  // tile share a set of L1 with: rows 4 KB apart (I = 1024) all fall in one set of 8 ways, and
  // a 14-row tile's broadcasts missed L1 (the input projection ran 20% slower than at
  // I = 1000).
  size_t xBuffer = 0;
  int64_t xStride = 0;
  // GPU, the recurrent products: a warp computes one column (of every slice) of a tile of rows,
  // its 32 lanes splitting the depth (lane l takes depths l, l + 32, ...) and summing their
  // parts with shuffles; the weights packed column after column, each slice's depths side by
  // side ([column][slice][depth]) so that a warp's 32 depths are one 128-byte load. A step's
  // product then runs on columns * row tiles warps rather than as many threads: at batch 1 one
  // thread per column left all but one multiprocessor idle.
  bool splitDepth = false;
  // GPU, the input projection and (at large batches) the recurrent products: block tiles
  // through shared memory, the classic SIMT SGEMM. A block of `blockThreads` threads computes
  // `tileRows` rows by `width` columns of every slice; each thread `threadRows` rows by
  // `threadColumns` columns (of every slice, so that the kernel's elementwise work on a column
  // has all its sums in one thread). The depth is walked `depthChunk` at a time: the block
  // copies the tile's rows of x (transposed) and its weights for those depths to shared memory,
  // waits, accumulates, waits. The weights are packed [block][depth][column][slice] (zero past
  // the kernel's columns and, to a whole number of chunks, past the depth) so that a chunk is
  // one contiguous run and a thread's weights at one depth are side by side (vector loads).
  // Each block then reads its rows of x and its weights once per chunk rather than each thread
  // streaming its own from L2 (the thread-per-column tiles ran the input projection at
  // 8 TFLOP/s on an H200).
  // A step's product (a few dozen rows) splits the depth between `depthGroups` groups of such
  // threads as well, each a run of whole chunks in its own part of shared memory, the groups'
  // sums added at the end through shared memory: a block of one group of 64 threads had 2 warps
  // on a multiprocessor to cover 32 chunks' latencies one after the other (18 us a step of the
  // default LSTM on an H200).
  bool blockTiled = false;
  int64_t threadRows = 1, threadColumns = 1, blockThreads = 0, depthChunk = 1, depthGroups = 1;
  // A block tile on the tensor cores (mma.sync m16n8k8 on TF32, each product as three, "3xTF32",
  // so that the sums keep fp32's accuracy): each warp of a depth group computes warpTileRows x
  // warpTileColumns tiles of 16 rows by 8 packed columns (a column's slices side by side) from
  // the same shared memory, and the block's sums go through shared memory ([group][row][packed
  // column]) to the threads that finish them, a column of every slice each. The SIMT tile
  // (threadRows x threadColumns) then only shapes the block. On an H200 the SIMT input
  // projection ran at 38% of the FMA peak, its shared-memory loads 91% busy: a thread's 32
  // FMAs per depth took three 16-byte loads, where a warp's 24 MMAs per 8 depths take 16
  // 4-byte loads.
  bool tensorCores = false;
  int64_t warpTileRows = 0, warpTileColumns = 0;

  int64_t slices() const { return static_cast<int64_t>(offsets.size()); }
  // In no kernel: its tiles are stored to the product's own buffer.
  bool standalone() const { return product->kernel < 0; }
  // The packed elements: one weight of `weights`'s type, but for int8 a 32-bit group of the
  // weights of 4 consecutive depths (what vpmaddubsw multiplies with 4 bytes of the input), the
  // depth then counted in groups (zero past the depth).
  int64_t packedDepth() const {
    if (blockTiled)
      return (depth + depthChunk - 1) / depthChunk * depthChunk;
    if (amxTiles) {
      const int64_t perWord = weights == WeightType::I8 ? 4 : 2;
      return (depth + perWord * kAmxTileWords - 1) / (perWord * kAmxTileWords) * kAmxTileWords;
    }
    return weights == WeightType::I8 ? (depth + 3) / 4 : depthPairs ? (depth + 1) / 2 : depth;
  }
  // A block-tiled product's shared memory, in floats: the chunk's rows of x, transposed, each
  // depth's `tileRows` padded to keep the threads' vector loads aligned and the block's
  // transposing stores off one bank; then its weights.
  // On the tensor cores, both strides are 8 or 24 floats past a multiple of 32, so that the
  // fragments' loads (lane 4g + t reads depth t, row or column g) hit 32 different banks.
  int64_t sharedRowStride() const { return tileRows + (tensorCores ? 8 : 4); }
  int64_t sharedWeightStride() const { return width * slices() + (tensorCores ? 8 : 0); }
  int64_t stageFloats() const { // a depth group's
    return depthChunk * sharedRowStride() + depthChunk * sharedWeightStride();
  }
  int64_t sharedSumStride() const { return width * slices() + 4; } // tensor cores' sums, a row's
  int64_t sharedFloats() const { // the staging, then (depth groups, tensor cores) the sums
    const int64_t sums = tensorCores       ? depthGroups * tileRows * sharedSumStride()
                         : depthGroups > 1 ? blockThreads * threadRows * threadColumns * slices()
                                           : 0;
    return std::max(depthGroups * stageFloats(), sums);
  }
  int64_t packedElementBytes() const {
    return weights == WeightType::I8 || depthPairs ? 4 : weightTypeBytes(weights);
  }
  // All of its packed weights, every block (what a thread walking every block reads per step).
  int64_t packedBytes() const {
    return blocks * packedDepth() * slices() * width * packedElementBytes();
  }
  // Where the packed elements of (slice, packed depth 0) of block 0 start; packed depth k adds
  // k * panelWidth(slice), block b adds b * packedDepth() * slices() * width.
  int64_t sliceStart(int64_t slice) const;
  int64_t panelWidth(int64_t slice) const; // packed elements per packed depth in its panel
};

// On a GPU (Target::isGpu): a split-depth product's columns per block of its packing and rows
// per warp; a warp's lanes.
inline constexpr int64_t kGpuBlockColumns = 32;
inline constexpr int64_t kGpuSplitDepthTileRows = 4;
inline constexpr int64_t kGpuWarpLanes = 32;
inline constexpr int64_t kGpuDepthUnroll = 4; // depths whose loads a product issues at once
// Batches from which a step's products run in shared-memory block tiles (blockTiled) rather
// than split-depth warps; passed as planStorage's gpuStepTileRows to ask for them. An LSTM of
// 512 on an H200, block tiles / split-depth warps, per step and persistent ms: batch 8
// 1.06 / 0.88 and 0.97 / 0.80; 16: 1.16 / 1.05, 1.10 / 0.97; 32: 1.38 / 1.42, 1.30 / 1.76;
// 48: 1.54 / 2.12, 1.44 / 2.00.
inline constexpr int64_t kGpuBlockTiledBatch = 32;
// Blocks of block tiles each multiprocessor is to hold at once (the kernels' launch bounds).
inline constexpr int64_t kGpuBlockTilesPerMultiprocessor = 2;
inline constexpr int64_t kGpuStepBlockTiles = 0;

using ir::KernelGroup;
using ir::kernelGroups;

// Per slice of `packed` (in its offsets' order), the values of its kernel `group` that are that
// slice of the product, which the tiles hold in registers; standalone (no group): the product's
// result as slice 0.
std::vector<std::vector<const ir::Value*>>
sliceValuesOf(const ir::Block& block, const KernelGroup* group, const PackedProduct& packed);

struct StoragePlan {
  std::vector<BufferSpec> buffers;
  std::unordered_map<const ir::Value*, size_t> bufferOf; // index into buffers
  bool outputInPlace = false; // the output value is written straight into the output sequence
  // Step values stored straight into their columns of the output rows, by first column: the
  // parts of an output that is a concat of what the step computes (a training forward's
  // outputs: h and the values its backward reads; a backward's gate gradients, through the
  // concats within it), which then need no buffer and no copy (but to a value's further
  // places, where it appears more than once).
  std::unordered_map<const ir::Value*, int64_t> inOutputColumns;
  // Per state update: a buffer to stage the next value in before states are overwritten, when
  // the next value is read from a state (return h = c, c = h); -1 otherwise.
  std::vector<int> staging;
  // Per state update: the kernel that computes the next value also stores it over the state
  // itself, so no buffer or end-of-step copy is needed. Safe when, from that kernel on, only
  // the kernel reads the state, element by element (c in c' = f * c + i * g).
  std::vector<bool> updatedInKernel;
  // Per state update: the next value is the step's output, or lies in its columns (a concat's
  // part: the h of a training forward, whose output keeps what its backward reads beside h), so
  // from the second step on the state is read straight from the previous step's output rows (at
  // readFromOutputColumn, with the output's row stride), and only the last step's rows are copied
  // to the state, after the loop: no copy and no barrier per step (h of LSTM, GRU, RNN).
  std::vector<bool> readFromOutput;
  std::vector<int64_t> readFromOutputColumn; // the next value's first column in the output rows
  std::vector<PackedProduct> packedProducts;

  const PackedProduct* packedProductOf(const ir::Instr* product) const;
};

// `cell` must be optimised (or at least verified) and have every size bound. The target's
// vector width and registers shape the tiles of fused matrix products; `weights` is how every
// packed product stores its weights, but for fp16 weights with `widenCachedFp16` the step's
// products whose fp32 weights fit in half of the target's L2, widened at packing
// (PackedProduct::widenedFrom), where the target's widening competes with its FMAs
// (Target::widensFp16BesideFmas).
// On a GPU, `gpuStepTileRows` is the rows of each warp's tile in a step's split-depth products
// (kGpuSplitDepthTileRows suits batches of that many rows and more; 1 smaller ones), or
// kGpuStepBlockTiles for block tiles (batches of kGpuBlockTiledBatch rows and more).
StoragePlan planStorage(const ir::Cell& cell, const Target& target,
                        WeightType weights = WeightType::F32,
                        int64_t gpuStepTileRows = kGpuStepBlockTiles, bool widenCachedFp16 = true);

// The table that tells the runtime's packer (rnnc_pack_weights, runtime/exec/WeightPacking.h)
// how `packed` lays its weights out: the fields codegen/RunArgs.h names RNNC_PACK_*, then per
// slice its column offset, packed start and panel width. The CPU code passes it to the packer;
// bench/packing_bench.cpp times the packer on it.
std::vector<int64_t> packLayout(const PackedProduct& packed);

// A kernel's iteration space [R, F]: batched (R the run's rows) or R fixed; and whether a layer
// norm is fused in (its row statistics are computed per row).
struct KernelSpace {
  bool batched = false;
  int64_t fixedRows = 1;
  int64_t cols = 1;
  bool normalises = false;
};
KernelSpace kernelSpace(const ir::Block& block, const KernelGroup& group);

// What the code generator emits for a block, one unit of work at a time: a fused kernel (led by
// a packed product or not), a packed product alone, or one instruction; immediates and views
// (alone, or kernels of nothing else) cost nothing until read and are not units.
struct WorkUnit {
  size_t first, last;                    // [first, last) in the block
  bool kernel = false;                   // a KernelGroup
  const PackedProduct* packed = nullptr; // the packed product it is or leads
  // Every value it writes is without a batch dimension (parameter-only work, done once).
  bool unbatched = false;
};
std::vector<WorkUnit> workUnits(const ir::Block& block, const StoragePlan& plan);

// Whether `value` is only a view (slice) or an immediate (const), never stored.
bool isViewOrImmediate(const ir::Value* value);

} // namespace rnnc::codegen

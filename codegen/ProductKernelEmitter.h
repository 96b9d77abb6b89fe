// The code generator's part for matrix products in register tiles (over
// codegen/EmitContext.h; the plan is codegen/StoragePlan.h's PackedProduct): weights packed in
// tile order by the parameter phase, tiles accumulated over the depth, then the elementwise
// work of the kernel the product is fused into (passes/FuseMatMul.h) run on each tile, or the
// tile stored (a standalone product). Internal to codegen/.
#pragma once

#include "codegen/EmitContext.h"
#include "codegen/KernelEmitter.h"

#include <functional>

#include <vector>

namespace rnnc::codegen {

// The height of a tile known only at run time (ProductKernelEmitter::emitTile).
struct RunTimeHeight {
  llvm::Value* rows = nullptr; // none: all the tile's rows are real
  int64_t atLeast = 0;         // rows below this one are always computed
};

class ProductKernelEmitter {
public:
  ProductKernelEmitter(EmitContext& e, KernelEmitter& kernels) : e(e), kernels(kernels) {}

  // Packs a product's weights in tile order (StoragePlan.h, PackedProduct): per block of
  // columns, per depth k, each slice's `width` weights side by side; zero past the columns. A
  // call of the runtime's packer (codegen/RunArgs.h, rnnc_pack_weights) on this thread's blocks.
  void emitPacking(const PackedProduct& packed);

  // A product computed in tiles, led by its kernel `group` or, with no group, standalone: per
  // chunk of rows, per block of `width` columns, per tile of rows, the product's columns of
  // every slice are computed in registers, then the kernel's elementwise work runs on them
  // (standalone: they are stored).
  void emitProductKernel(const ir::Block& block, const KernelGroup* group,
                         const PackedProduct& packed, llvm::Value* batchRows);

  // Whether the tiles of `packed` ask for the next block's panel as they walk the depth: weights
  // past L2 (not int8 or bf16 pairs, whose tiles are not walks).
  static bool asksForNextPanels(const PackedProduct& packed, const Target& target);
  // Whether a tile that asks for no panel takes the walk of its shape that asks for one, where
  // the module has it (emitTile): with 32 vector registers.
  static bool sharesPrefetchingWalks(const Target& target) { return target.vectorRegisters > 16; }

private:
  // Whether another product of the cell, tiled like `packed`, asks for next panels: then
  // `packed`'s tiles take its walk from the start, whichever product the part emits first.
  bool anotherWalkPrefetches(const PackedProduct& packed) const;

  using Tile = std::vector<std::vector<llvm::Value*>>; // per row, one vector per slice
  using Accumulators = std::vector<llvm::Value*>;      // a tile's running sums

  // Asks for the lines of `operands` the epilogue of the tile at firstRow will read.
  void prefetchRows(const std::vector<const ir::Value*>& operands, llvm::Value* firstRow,
                    llvm::Value* lastRow, llvm::Value* column, int64_t rows);

  // The next block's panel, which the tiles of this block bring into cache a line per depth
  // step (emitProductKernel): its first weight, the first line this tile asks for, and the last
  // line of the panel; no panel: no prefetch.
  struct PanelPrefetch {
    llvm::Value* panel = nullptr;
    llvm::Value* firstLine = nullptr;
    llvm::Value* lastLine = nullptr; // a constant, or (a walk's function) its argument
    int64_t lineElements = 0;
  };
  // Rows [firstRow, firstRow + rows) of x times block `blk` of the packed weights, each row's
  // sum of each slice given to `store`. The slices are accumulated in passes of as many as the
  // tile's accumulators allow for this many rows (a panel for a full tile, all of them for one
  // row); each pass is one walk over the depth. Passes alike (as many slices, at a fixed distance
  // in the packed weights: an LSTM's two passes of two gates) are a loop at run time, one walk
  // emitted for all of them, its slices' index a run-time value: half the code LLVM compiles for
  // an LSTM's tiles, for a loop of two trips around thousands of FMAs.
  //
  // A tile of run-time height (`height.rows`, from `height.atLeast` to `rows`; RunTimeHeight
  // above) is the tile of `rows` rows whose rows from `atLeast` on are each computed only below
  // the height: one walk for every height from half a tile to a full one, where a variant per
  // height multiplied what LLVM compiles (an outlined walk of AVX2's few FMAs a depth step has
  // a depth loop per height, in one function). Its rows at and past the height give `store`
  // sums of no meaning.
  //
  // `tileMemory`: where `store` puts the sums, as an array of vectors of the block's width,
  // `slices` of them a row. Given, a full tile's walks may be calls of a function of their
  // shape instead (EmitContext::TileWalks), which write there themselves; else `store` gets
  // every sum.
  using TileStore = std::function<void(int64_t row, llvm::Value* slice, llvm::Value* sum)>;
  void emitTile(const View& x, llvm::Value* weights, const PackedProduct& packed, llvm::Value* blk,
                llvm::Value* firstRow, int64_t rows, const PanelPrefetch& nextPanel,
                const TileStore& store, RunTimeHeight height = {},
                llvm::Value* tileMemory = nullptr);
  // One depth step's FMAs of rows [from, to) of a run-time height tile (emitTile), each row's in
  // a block of its own entered only below the height: comparisons with the height enter the
  // chain at the tile's last real row, and each row falls through to the one below it. `rowFmas(m,
  // acc)` emits row m's FMAs into `acc`, whose rows past `from` the chain's phis then carry.
  void emitRowsBelowHeight(llvm::Value* height, int64_t from, int64_t to, size_t perRow,
                           Accumulators& acc,
                           const std::function<void(int64_t m, Accumulators& acc)>& rowFmas);

  // Packed weights in another type than fp32 (codegen/WeightType.h): the element type in
  // memory, and a vector of them widened back to fp32 in the tiles.
  llvm::Type* weightElementType(WeightType type) const;
  llvm::Value* widenWeights(llvm::Value* packed, WeightType type);

  // int8 (codegen/QuantizedProducts.cpp; the weights are quantized per column as they are packed,
  // by the runtime's packer): rows [rows) of `from` quantized into `to` (bytes, then the row's
  // scale and zero point in its last two floats of `stride`); a tile of int32 sums, dequantized
  // to fp32.
  void quantizeRows(const View& to, const View& from, RowRange rows, int64_t depth, int64_t stride);
  Tile emitInt8Tile(const View& x, llvm::Value* words, const PackedProduct& packed,
                    llvm::Value* blk, llvm::Value* firstRow, int64_t rows);
  // Dequantizing an int8 tile's sums (the vector tiles' and the AMX tiles'): the weight scales
  // and column sums of slices [first, first + count) of block `blk`, then a row's int32 sums of
  // those slices as (sum - zero * colsum) * (x_scale * w_scale), the row's scale and zero point
  // read from the last two floats of its copy's stride (quantizeRows).
  struct Int8Columns {
    std::vector<llvm::Value*> weightScale, columnSum;
  };
  Int8Columns int8Columns(const PackedProduct& packed, llvm::Value* blk, int64_t first,
                          int64_t count);
  std::vector<llvm::Value*> dequantizedRow(const PackedProduct& packed, llvm::Value* rowStart,
                                           const std::vector<llvm::Value*>& sums,
                                           const Int8Columns& columns);
  // The register budget of a tile of `rows` rows, with `spare` registers kept beside the
  // accumulators and weights (the broadcast input; int8's temporaries): how many slices one pass
  // over the depth accumulates, and between how many accumulator sets a pass of `count` slices
  // splits a depth of `depth` steps.
  int64_t slicesPerPass(const PackedProduct& packed, int64_t rows, int64_t spare) const;
  int64_t accumulatorSets(const PackedProduct& packed, int64_t rows, int64_t count, int64_t spare,
                          int64_t depth) const;
  // bf16 (codegen/Bf16Products.cpp): fp32 values (a scalar or a vector) rounded to nearest
  // even, as bf16 bit patterns (i16); rows [rows) of `from` copied into `to` with each value
  // rounded to bf16, as bf16 (`pairs`: 2 bytes each, zero past an odd depth) or as fp32; a tile
  // of vdpbf16ps over depth pairs (PackedProduct::depthPairs).
  llvm::Value* bf16Bits(llvm::Value* v);
  // Each row's bf16 copy is `values` long: zero past the depth (a pair's upper half, AMX's
  // padding to whole tiles).
  void bf16Rows(const View& to, const View& from, RowRange rows, int64_t depth, bool pairs,
                int64_t values);
  Tile emitBf16PairTile(const View& x, llvm::Value* words, const PackedProduct& packed,
                        llvm::Value* blk, llvm::Value* firstRow, int64_t rows);
  // The same product on AMX tiles (PackedProduct::amxTiles, codegen/AmxTiles.cpp).
  Tile emitAmxTile(const View& x, llvm::Value* words, const PackedProduct& packed, llvm::Value* blk,
                   llvm::Value* firstRow, int64_t rows);
  void emitAmxTileBody(const PackedProduct& packed, int64_t rows, llvm::Value* rowsBase,
                       llvm::Value* rowStride, llvm::Value* block, llvm::Value* sums);
  // A tile's walk over the depth: `chains` sets of `accumulators` values each, all starting at
  // `zero`; steps [0, steps / chains * chains) in a loop, step k into set k % chains (`step`
  // gets k and that set), the rest after it into set 0. Returns the sets' final values. With
  // `runTimeSteps` (one set only, at least one step) the loop runs that many steps instead.
  std::vector<Accumulators>
  accumulateOverDepth(int64_t chains, int64_t steps, size_t accumulators, llvm::Value* zero,
                      const std::function<void(llvm::Value* k, Accumulators& acc)>& step,
                      const std::string& name, llvm::Value* runTimeSteps = nullptr);
  // Tiles whose multiplies take 32-bit groups of packed elements (int8, bf16 pairs), in `parts`
  // vectors of `lanes` columns per slice: the weights of the pass's slices [first, first +
  // sliceWords.size()) at packed depth k, each part loaded as `type` (w[slice][part]); and a
  // column's parts joined back into one vector of the block's width.
  std::vector<std::vector<llvm::Value*>>
  loadWeightParts(const PackedProduct& packed, const std::vector<llvm::Value*>& sliceWords,
                  int64_t first, llvm::Value* k, int64_t parts, int64_t lanes, llvm::Type* type);
  llvm::Value* joinParts(std::vector<llvm::Value*> parts);
  // Accumulators [first, first + parts) of every set added up (fp or integer), then joined.
  llvm::Value* sumOfSets(const std::vector<Accumulators>& sets, size_t first, int64_t parts);
  // A slot in the function's entry block (promoted to a register by LLVM): loop-carried values
  // of forLoop bodies.
  llvm::Value* entrySlot(llvm::Type* type, const char* name);
  // round-to-nearest-even of v, clamped to [lowest, highest], as an i32; clampToInt: v (an
  // integer already) clamped. A NaN gives `lowest`.
  llvm::Value* roundToInt(llvm::Value* v, float lowest, float highest);
  llvm::Value* clampToInt(llvm::Value* v, float lowest, float highest);

  EmitContext& e;
  KernelEmitter& kernels;
};

} // namespace rnnc::codegen

// The C ABI between generated code and the runtime: `void rnnc_run(const RnncRunArgs*)` runs a
// whole sequence, and the generated code calls the helpers below, which the runtime provides to
// the JIT as absolute symbols. Plain C types only: both sides must agree without LLVM.
#pragma once

#include <cstdint>

extern "C" {

struct RnncRunArgs {
  int64_t steps;              // T
  int64_t batch;              // B
  const float* const* params; // cell.params order, dense row-major
  const float* const* inputs; // cell.inputs order, [T*B, F] each
  float* const* states;       // cell.states order, [B, F] each: initial in, final out
  float* output;              // [T*B, H]
  float* const* buffers;      // StoragePlan::buffers order, sized as the plan says
  int64_t phases;             // RnncPhase bits: which parts of the sequence to run
  // `threads` threads run the same call at once, each with its own `thread` in [0, threads)
  // and the same `team`, which the generated code passes to rnnc_barrier. One thread: 0, 1.
  int64_t thread;
  int64_t threads;
  void* team;
  // Floats from one row of each input to the next (cell.inputs order): inputs may be columns of
  // a wider tensor (the training's saved values side by side) without a copy. Read by CPU code
  // only; a GPU's inputs are dense.
  const int64_t* inputStrides;
  // Nonzero: the loop runs the steps from the last to the first (a reverse direction over whole
  // sequences, without a reversed copy of its inputs): loop step t reads and writes the rows of
  // step `steps - 1 - t`. CPU code only.
  int64_t reverse;
  // Training dropout (ir::Op::DropoutMask, runtime/exec/Hash.h): the run's seed, and the mask
  // row of the call's first step's first row (the rows a direction runs counted in the order it
  // runs them: step t of the call, row b, is mask row maskRow + t * batch + b). Read only by the
  // code of cells with masks.
  uint64_t maskSeed;
  int64_t maskRow;
};

// The phases run in this order when a call asks for several. Run apart: the parameter-only work
// (stacked weights, summed biases, weights packed for fused products) is done once when a layer is
// built; and the pre phase can cover the rows of several calls of the loop (variable-length
// batches premultiply all their packed rows at once, then run each stretch of steps with the
// same active batch on its rows of the pre buffers).
enum RnncPhase : int64_t {
  RNNC_PHASE_PARAMS = 4, // the pre block's work without a batch dimension; fills fixed buffers
  RNNC_PHASE_PRE = 1,    // the pre block's per-row work over steps * batch rows
  RNNC_PHASE_LOOP = 2,   // the time loop, reading pre buffers at row t * batch
};

using RnncRunFunction = void (*)(const RnncRunArgs*);

// C[M, N] = A[M, K] @ (transposeB ? B[N, K]^T : B[K, N]); leading dimensions in elements.
using RnncGemmFunction = void (*)(int64_t transposeB, int64_t m, int64_t n, int64_t k,
                                  const float* a, int64_t lda, const float* b, int64_t ldb,
                                  float* c, int64_t ldc);
// Returns when every thread of the team has called it (for this step's phase of the work).
using RnncBarrierFunction = void (*)(void* team);
// Where `thread`'s part of `total` blocks of work that may move between threads starts
// (thread == threads: total): the recurrent products' column blocks, divided by each thread's
// measured speed (runtime/threads/WorkBalance.h). The same for every thread between barriers.
using RnncShareStartFunction = int64_t (*)(void* team, int64_t thread, int64_t total);
// Called as `thread` starts (stop = 0) and stops (1) its share of that work: its speed.
using RnncShareClockFunction = void (*)(void* team, int64_t thread, int64_t stop);
// How a product's rows [0, rows) are cut into register tiles (codegen/TileRows.h, for the
// shapes whose TileShapes::code() is `shapes`), computed by the runtime rather than emitted as
// IR: LLVM's DAG combiner asked the known bits of every multiply of that arithmetic (divisions
// by the tile heights, a dozen selects), 15% of the back end's work on the default LSTM's setup
// module (callgrind: 73M -> 62M instructions; the loop's 77M -> 72M). Pure functions of their
// arguments: the generated code hoists the calls out of the time loop where the rows do not
// change.
// `field`: RnncTileSplitField.
enum RnncTileSplitField : int64_t {
  RNNC_TILES_FULL_END,      // where the full tiles end (TileSplit::fullEnd)
  RNNC_TILES_SHORTENED_END, // TileSplit::shortenedEnd
  RNNC_TILES_SHORTER_END,   // TileSplit::shorterEnd
  RNNC_TILES_UNITS,         // the units threads and chunks take (tileUnits)
};
using RnncTileSplitFunction = int64_t (*)(int64_t rows, int64_t shapes, int64_t field);
// The first row of unit `unit` of that split (tileUnitStart; unit == units: rows).
using RnncTileUnitStartFunction = int64_t (*)(int64_t rows, int64_t shapes, int64_t unit);

// Per row: y = (x - mean) / sqrt(var + eps).
using RnncLayerNormFunction = void (*)(int64_t rows, int64_t cols, const float* x, int64_t ldx,
                                       float* y, int64_t ldy, float eps);
// Per row: dx = (g - mean(g) - y mean(g y)) / sqrt(var + eps) with y = layernorm(x).
using RnncLayerNormGradFunction = void (*)(int64_t rows, int64_t cols, const float* x, int64_t ldx,
                                           const float* g, int64_t ldg, float* dx, int64_t lddx,
                                           float eps);

// Dropout masks (ir::Op::DropoutMask) for `rows` rows of a block, from row `firstRow` of its
// `steps` * `batch` rows on: row s is step s / batch's row s % batch, which the call ran as its
// step (reverse ? steps - 1 - s / batch : s / batch), so its mask row is maskRow + that step *
// batch + s % batch. out[i * ldo + c] = 1 / (1 - p) where kept, 0 where dropped.
using RnncDropoutMaskFunction = void (*)(int64_t rows, int64_t cols, float* out, int64_t ldo,
                                         int64_t firstRow, int64_t steps, int64_t batch,
                                         int64_t reverse, int64_t maskRow, uint64_t seed,
                                         int64_t stream, double p);

// Packs a product's weights in its tiles' order (codegen/StoragePlan.h, PackedProduct), the
// blocks of columns shared between the `threads` threads of a call: the parameter phase's work,
// done once per set of weights, in C++ rather than in every cell's generated code (where its
// loops were a tenth of the back end's work of a cold compile). `layout` is an array of int64_t
// (RnncPackField, then per slice its column offset, packed start and panel width); element
// (k, column) of the weights is w[column * rowStride + k] if transposed, else
// w[k * rowStride + column]; `scales` is the int8 scale buffer (null otherwise).
enum RnncPackField : int64_t {
  RNNC_PACK_WEIGHT_TYPE, // codegen::WeightType: 0 fp32, 1 fp16, 2 bf16, 3 int8
  RNNC_PACK_TRANSPOSED,
  RNNC_PACK_DEPTH_PAIRS,
  RNNC_PACK_WIDTH,
  RNNC_PACK_BLOCKS,
  RNNC_PACK_COLUMNS,
  RNNC_PACK_DEPTH,
  RNNC_PACK_PACKED_DEPTH,
  RNNC_PACK_SLICES,
  RNNC_PACK_WIDENED_FROM, // codegen::WeightType the fp32 weights are rounded to (fp32: none)
  RNNC_PACK_FIELDS        // the slices' triples start here
};
using RnncPackWeightsFunction = void (*)(const int64_t* layout, const float* w, int64_t rowStride,
                                         void* packed, float* scales, int64_t thread,
                                         int64_t threads);
}

namespace rnnc::codegen {
// The names the generated code calls the helpers by.
inline constexpr const char* kRunFunctionName = "rnnc_run";
inline constexpr const char* kGemmSymbol = "rnnc_gemm";
inline constexpr const char* kLayerNormSymbol = "rnnc_layernorm";
inline constexpr const char* kLayerNormGradSymbol = "rnnc_layernorm_grad";
inline constexpr const char* kDropoutMaskSymbol = "rnnc_dropout_mask";
inline constexpr const char* kBarrierSymbol = "rnnc_barrier";
inline constexpr const char* kShareStartSymbol = "rnnc_share_start";
inline constexpr const char* kShareClockSymbol = "rnnc_share_clock";
inline constexpr const char* kPackWeightsSymbol = "rnnc_pack_weights";
inline constexpr const char* kTileSplitSymbol = "rnnc_tile_split";
inline constexpr const char* kTileUnitStartSymbol = "rnnc_tile_unit_start";
} // namespace rnnc::codegen

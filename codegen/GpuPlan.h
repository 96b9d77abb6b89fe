// How a cell runs on a GPU (issue 15): as a sequence of regions, each a grid-wide piece of work
// that every thread of the grid runs on its own items (a grid-stride loop: item = thread,
// thread + threads, ...), with a grid-wide barrier between any two regions. No thread reads
// what another thread wrote in the same region, so a region is correct for any number of
// threads and in any order of them: the host emulation runs the threads one after the other.
//
//   params  the pre block's parameter-only work (stacked weights, summed biases), then every
//           packed product's weights packed for its tiles (StoragePlan's PackedProduct:
//           blockTiled or splitDepth);
//   pre     the pre block over T*B rows: the input projection of all steps as one product;
//   step    per step: the step block's units (the recurrent product with its cell epilogue as
//           one region), then the copies that end a step (output, staged next states), then
//           the state updates;
//   final   the final states that the loop read from the output rows.
//
// Launched one kernel per region (the per-step plan), or the step regions of all steps in one
// persistent kernel whose blocks meet at a grid barrier after each (codegen/GpuEmitter.h).
// No LLVM here: the runtime reads the regions to launch them.
#pragma once

#include "codegen/StoragePlan.h"
#include "ir/Cell.h"

#include <string>
#include <vector>

namespace rnnc::codegen {

enum class GpuPhase { Params, Pre, Step, Final };

struct GpuRegion {
  enum class Kind {
    Kernel,      // a fused elementwise kernel: one item per element
    RowKernel,   // a kernel with a layer norm fused in: one item per row
    Product,     // a packed product (with the kernel it leads): one item per column of a tile
                 //   of rows (split depth: a warp), or per block tile (block tiled: a block)
    Instruction, // a product without packed weights, a layer norm, a concat or a stack
    Packing,     // a packed product's weights, packed: one item per packed weight
    StepOutputs, // the step's output copied to the output rows, next states staged
    StepStates,  // the states overwritten by their next values
    FinalStates  // states read from the output during the loop get the last step's rows
  };
  Kind kind;
  GpuPhase phase;
  const ir::Block* block = nullptr; // Kernel, RowKernel, Product, Instruction
  WorkUnit unit{0, 0};
  const PackedProduct* packed = nullptr; // Product, Packing
  // The items: ceil(rows / rowsPerItem) * itemsPerRow, rows fixed or (batched) the run's.
  Rows rows = Rows::Fixed;
  int64_t fixedRows = 1;
  int64_t rowsPerItem = 1;
  int64_t itemsPerRow = 1;

  int64_t rowCount(int64_t steps, int64_t batch) const;
  int64_t items(int64_t steps, int64_t batch) const;
  // The GPU threads that run them: a split-depth product's items are warps, a block-tiled one's
  // blocks.
  int64_t threads(int64_t steps, int64_t batch) const;
  // The threads a block of its launch must have: a block tile's; 0 for any whole warps.
  int64_t blockThreads() const {
    return kind == Kind::Product && packed->blockTiled ? packed->blockThreads : 0;
  }
  std::string describe(const ir::Cell& cell) const; // "step: kernel %12..%30 led by linear"
};

// The regions of a cell planned for a GPU target (planStorage with Target::isGpu), in order.
std::vector<GpuRegion> planGpuRegions(const ir::Cell& cell, const StoragePlan& plan);

const char* gpuPhaseName(GpuPhase phase);

} // namespace rnnc::codegen

// Where every value of an optimised cell lives when the generated code runs:
//   - arguments: the caller's params, inputs (read per step) and states;
//   - constants: immediates; slices: views (an offset into what they slice);
//   - values made and used inside one fused kernel: registers only;
//   - everything else: a buffer the runtime allocates, with T*B rows (pre), B rows (step) or
//     one row (no batch dimension). The step's output value is written straight into the output
//     sequence instead of a buffer.
// No LLVM here: the runtime reads the plan to allocate, the emitter to address.
#pragma once

#include "ir/Cell.h"

#include <unordered_map>
#include <vector>

namespace rnnc::codegen {

enum class Rows { Sequence, Step, Fixed }; // T*B, B, or a fixed count

struct BufferSpec {
  const ir::Value* value;
  Rows rows;
  int64_t fixedRows; // the row count when rows == Fixed (1 for a vector)
  int64_t cols;
};

// A group of instructions the emitter turns into one loop nest: a fused kernel, or a single
// elementwise instruction that was not fused (--no-fuse).
struct KernelGroup {
  size_t first, last; // [first, last) in the block
};

struct StoragePlan {
  std::vector<BufferSpec> buffers;
  std::unordered_map<const ir::Value*, size_t> bufferOf; // index into buffers
  bool outputInPlace = false; // the output value is written straight into the output sequence
  // Per state update: a buffer to stage the next value in before states are overwritten, when
  // the next value is read from a state (return h = c, c = h); -1 otherwise.
  std::vector<int> staging;
  // Per state update: the kernel that computes the next value also stores it over the state
  // itself, so no buffer or end-of-step copy is needed. Safe when, from that kernel on, only
  // the kernel reads the state, element by element (c in c' = f * c + i * g).
  std::vector<bool> updatedInKernel;
};

// `cell` must be optimised (or at least verified) and have every size bound.
StoragePlan planStorage(const ir::Cell& cell);

// The loop nests of a block: each entry is a run of instructions emitted as one kernel.
std::vector<KernelGroup> kernelGroups(const ir::Block& block);

// The number of rows of an unbatched value (the product of its leading dimensions; 1 for a
// vector or scalar).
int64_t fixedRowsOf(const ir::Value* value);

// Whether `value` is only a view (slice) or an immediate (const), never stored.
bool isViewOrImmediate(const ir::Value* value);

// The number of columns of a value (its last dimension; 1 for a scalar).
int64_t columnsOf(const ir::Value* value);

} // namespace rnnc::codegen

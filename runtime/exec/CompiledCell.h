// A cell compiled to native code: the optimised IR, its storage plan and the JIT-loaded
// `rnnc_run` function. run() has the interpreter's interface, so the two are interchangeable and
// the interpreter is the oracle for it. Thread-safe: prepare() does the parameter-only work once
// into an immutable Prepared, and each run() writes only its own workspace, states and output;
// with `threads` > 1 a run borrows a team of threads (runtime/threads/ThreadTeam.h) for its
// duration; `threads` = 0 lets runtime/threads/ThreadGovernor.h choose: every core, fewer while
// other processes keep cores busy.
#pragma once

#include "codegen/StoragePlan.h"
#include "codegen/Target.h"
#include "ir/Cell.h"
#include "passes/PassManager.h"
#include "runtime/data/AlignedBuffer.h"
#include "runtime/data/Tensor.h"
#include "runtime/exec/CellBuild.h"
#include "runtime/exec/CompileCache.h"
#include "runtime/exec/ObjectLoader.h"

#include <chrono>
#include <functional>
#include <memory>
#include <ostream>
#include <vector>

namespace rnnc {

struct CompileOptions {
  passes::PipelineOptions pipeline;
  std::ostream* log = nullptr; // where --print-after-all and --print-after write; null: nowhere
  CacheOptions cache = CacheOptions::fromEnvironment();
  bool memoryCache = true; // reuse code compiled earlier in this process
  // Generate for this x86-64 CPU (LLVM's name: haswell, skylake-avx512, znver4...) instead of
  // the host, to run and time its code here (codegen::runnableTarget); empty: the host.
  std::string targetCpu;
  // The most memory the pre block's per-row buffers (the premultiplied inputs, [rows, 4H] for an
  // LSTM) may take: longer sequences run in chunks of steps, each chunk's pre phase just ahead
  // of its steps, so a run's memory is bounded whatever T is. With int8 or bf16-pair products
  // the chunks are smaller still, one core's L2 (CompiledCell.cpp's chunkBytesFor), so that the
  // steps read the premultiplied rows from cache.
  int64_t sequenceBufferBytes = int64_t{32} << 20;
  // How the weights of the matrix products the generated code packs are stored (every linear
  // and matmul whose weights are parameters): fp32, or fp16/bf16 in half the bytes.
  codegen::WeightType weights = codegen::WeightType::F32;
  // With fp16 weights: the step's products whose fp32 weights fit in half of one core's L2 take
  // them widened to fp32 at packing, the same values, read faster than fp16 is widened where
  // the widening takes the FMA ports (Intel's cores; codegen::Target::widensFp16BesideFmas,
  // codegen::PackedProduct::widenedFrom); false keeps fp16 in every tile.
  bool widenCachedFp16 = true;
};

// An input's rows where they are: `rows` rows of `columns` floats, `stride` floats apart (a
// dense tensor's own width, or more: columns of a wider tensor, read without a copy).
struct InputRows {
  const float* data = nullptr;
  int64_t rows = 0, columns = 0, stride = 0;
  // Every row of a dense [T, B, F] or [N, F] tensor.
  static InputRows of(const Tensor& t);
};

// Where compiled code came from.
enum class CodeSource { Compiled, MemoryCache, DiskCache };

class CompiledCell {
public:
  // `cell` must have all its sizes bound. Runs the pass pipeline on a copy, then LLVM.
  static std::shared_ptr<CompiledCell> compile(const ir::Cell& cell,
                                               const CompileOptions& options = {});
  // compile() for each of `cells`, in order, the distinct ones side by side on up to a thread per
  // core (each compile is one LLVM context and target machine: nothing shared but the caches):
  // the kernels of a layer (its directions, a training forward and its backward) and of a stack
  // arrive together. Identical cells share one result. One at a time where options.log is set,
  // so that what the passes print keeps its order. The first failure (in `cells` order) is
  // rethrown once every compile has finished.
  static std::vector<std::shared_ptr<CompiledCell>>
  compileAll(const std::vector<const ir::Cell*>& cells, const CompileOptions& options = {});

  // Scratch memory for run(); reusing one across calls makes a run allocate nothing. One per
  // thread: run() writes into it.
  class Workspace {
  private:
    friend class CompiledCell;
    std::vector<AlignedBuffer> buffers;
  };

  // The parameter-only work for one set of parameters, done once: stacked weights, summed
  // biases, the weights packed for fused products. Runs only read it, so concurrent runs share
  // one. It points into the parameters given to prepare(), which must outlive it.
  class Prepared {
  private:
    friend class CompiledCell;
    std::vector<const float*> params;
    // The fixed buffers side by side in one allocation, each on a cache line: a cell's packed
    // weights together reach the size that huge pages back (two 1 MB products then cost a page
    // fault or two, not 512), and `fixed` points into it (null for the plan's other buffers).
    AlignedBuffer fixedMemory;
    std::vector<float*> fixed;
  };
  // `params` in cell.params order.
  std::shared_ptr<const Prepared> prepare(const std::vector<Tensor>& params, int threads) const;

  // As Interpreter::run: inputs [T, B, F] in cell order, states [B, F] (updated to the final
  // states), returns the outputs [T, B, H]. Prepares `params` first.
  Tensor run(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
             std::vector<Tensor>& states) const;
  // The same into a caller's output tensor (resized if needed) and workspace, on `threads`
  // threads (each step split between them; see runtime/threads/ThreadTeam.h).
  void run(const std::vector<Tensor>& params, const std::vector<Tensor>& inputs,
           std::vector<Tensor>& states, Tensor& output, Workspace& workspace, int threads) const;
  void run(const Prepared& prepared, const std::vector<Tensor>& inputs, std::vector<Tensor>& states,
           Tensor& output, Workspace& workspace, int threads) const;
  // The same with each input's `steps` * `batch` rows where they are; `reverse`: the steps run
  // from the last to the first (each output row stays at its step), as a reverse direction
  // over whole sequences runs, without reversed copies of its inputs and outputs. `maskSeed`:
  // the seed of the dropout masks a training cell draws (ir::Op::DropoutMask), whose rows are
  // counted in the order the steps run.
  void run(const Prepared& prepared, int64_t steps, int64_t batch,
           const std::vector<InputRows>& inputs, std::vector<Tensor>& states, Tensor& output,
           Workspace& workspace, int threads, bool reverse = false, uint64_t maskSeed = 0) const;

  // Variable length, in cuDNN's and PyTorch's packed layout: `batchSizes[t]` (non-increasing)
  // sequences are active at step t, and `inputs` hold, step after step, the rows of the active
  // ones, [sum(batchSizes), F]. States are [batchSizes[0], F], in the same sequence order; a
  // finished sequence's rows keep its state from its last step. `output` gets the packed
  // outputs, [sum(batchSizes), H]. Per chunk of steps (CompileOptions::sequenceBufferBytes),
  // the pre block (the input GEMM) runs once over every packed row of the chunk, then the loop
  // runs each stretch of steps with the same active batch. Dropout masks' rows are the packed
  // rows.
  void runPacked(const Prepared& prepared, const std::vector<Tensor>& inputs,
                 const std::vector<int64_t>& batchSizes, std::vector<Tensor>& states,
                 Tensor& output, Workspace& workspace, int threads) const;
  void runPacked(const Prepared& prepared, const std::vector<InputRows>& inputs,
                 const std::vector<int64_t>& batchSizes, std::vector<Tensor>& states,
                 Tensor& output, Workspace& workspace, int threads, uint64_t maskSeed = 0) const;

  const ir::Cell& optimisedCell() const { return *cell_; }
  const codegen::StoragePlan& plan() const { return plan_; } // the tiles, buffers and weights
  // The time compile() took, and whether LLVM ran or a cache answered.
  double compileMilliseconds() const { return compileMs_; }
  CodeSource source() const { return source_; }

private:
  // compile() in two steps: the passes, the plan and the memory cache (lookUp), then the code
  // from the disk cache or LLVM where the memory cache had none (load).
  struct Lookup;
  static Lookup lookUp(const ir::Cell& cell, const CompileOptions& options);
  static std::shared_ptr<CompiledCell> load(Lookup&& lookup, const CompileOptions& options);

  void checkArity(const std::vector<InputRows>& inputs, const std::vector<Tensor>& states) const;
  // About what a run over `rows` rows (steps times sequences) takes on one thread.
  std::chrono::nanoseconds oneThreadTime(int64_t rows) const;
  // Buffer pointers for a call: the prepared fixed buffers and the workspace's others.
  std::vector<float*> bufferPointers(const Prepared& prepared, Workspace& workspace,
                                     int64_t sequenceRows, int64_t stepRows, int threads) const;

  // The bytes of the pre block's per-row buffers per packed row.
  int64_t sequenceBytesPerRow() const;

  std::shared_ptr<ir::Cell> cell_;
  codegen::StoragePlan plan_;
  void (*function_)(const void*) = nullptr;
  std::shared_ptr<void> lifetime_;
  double compileMs_ = 0;
  // The pre buffers' bytes per chunk of steps: CompileOptions::sequenceBufferBytes, or less
  // where caches hold less (chunkBytesFor in CompiledCell.cpp).
  int64_t sequenceBufferBytes_ = 0;
  // What an automatic thread count weighs (runtime/threads/ThreadGovernor.h): the matrix
  // products' work per row of a step, and what one thread takes to pack the weights.
  double flopsPerRow_ = 0;
  std::chrono::nanoseconds packingOnOneThread_{0};
  CodeSource source_ = CodeSource::Compiled;
};

} // namespace rnnc

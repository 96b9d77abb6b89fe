// From an optimised cell to native code: emit LLVM IR (codegen/CellEmitter), verify it,
// optimise it for the target, and produce an object file; or print any of those stages for
// `rnnc compile --emit=llvm|asm`.
#pragma once

#include "codegen/GemmTile.h"
#include "codegen/StoragePlan.h"
#include "codegen/Target.h"
#include "ir/Cell.h"

#include <string>
#include <vector>

namespace rnnc::codegen {

enum class Stage { LLVM, OptimisedLLVM, Assembly, Object };

// Lowers `cell` (verified, every size bound) to LLVM IR, verifies it, and unless `stage` is
// LLVM optimises it for the target (a short pipeline: the kernels are vectorised and unrolled
// by construction, so -O1's loop passes and O2's vectorisers add only compile time) and
// produces the stage. The run function is always `rnnc_run`: each loaded object lives in its
// own JIT dylib.
std::string generate(const ir::Cell& cell, const StoragePlan& plan, const Target& target,
                     Stage stage);

// Milliseconds of each part of generate() (`rnnc compile --time-passes`): emitting the LLVM IR,
// verifying it, setting up the target machine, LLVM's optimiser, its back end, summed over the
// cell's modules; and each module's own work (all five parts), in the order of `modules`. The
// modules compile side by side, a thread per core, so the longest of them bounds a cold
// compile on enough cores, not the sum: `wall` is what the caller waited for all of them.
struct CodegenTimes {
  double emit = 0, verify = 0, targetMachine = 0, optimise = 0, backEnd = 0;
  double wall = 0; // from the first module's start to the last one's end
  struct Module {
    std::string name; // its first function and what it holds, e.g. "rnnc_run.loop (time loop)"
    double ms = 0;
  };
  std::vector<Module> modules;
};
std::string generate(const ir::Cell& cell, const StoragePlan& plan, const Target& target,
                     Stage stage, CodegenTimes* times);

// A GPU's code (codegen/GpuEmitter.h) for `cell` planned for the GPU target `gpu`: its kernels
// as NVVM IR (Stage::LLVM, OptimisedLLVM) or PTX (Stage::Assembly).
std::string generateGpu(const ir::Cell& cell, const StoragePlan& plan, const Target& gpu,
                        Stage stage);

// The same GPU regions compiled for this machine, with `rnnc_emulate` (GpuEmitter.h), as any
// stage (Stage::Object for the JIT).
std::string generateGpuEmulation(const ir::Cell& cell, const StoragePlan& plan, Stage stage);

// The runtime GEMM's register tile (codegen/GemmTile.h) for `target`, as any stage.
std::string generateGemmTile(const Target& target, Stage stage,
                             GemmOperands operands = GemmOperands::F32);

} // namespace rnnc::codegen

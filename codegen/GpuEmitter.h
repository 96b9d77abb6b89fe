// Lowers a cell planned for a GPU (codegen/GpuPlan.h) to LLVM IR: one function per region,
// `void rnnc_region_<i>(const RnncRunArgs* args, i64 step, i64 thread, i64 threads)`, whose
// grid-stride loop runs the region's items `thread`, `thread + threads`, ... The arguments are
// the CPU's (RunArgs.h), in the GPU's memory. A block-tiled product's region runs a block per
// item instead (launched in blocks of its blockThreads: `thread` / blockThreads is the block),
// its threads meeting at the block's barriers; emulated, `thread` is the block, whose threads
// run one after the other in each phase between those barriers. The regions' code is the same for
// both modules this emits (Halide's CodeGen_PTX_Dev shares its lowering with the host the same
// way):
//   - for an NVIDIA GPU (nvptx64): the regions inlined into entry kernels, one per region,
//     `rnnc_kernel_<i>(args, step)` (thread = the global thread index), and one persistent
//     kernel `rnnc_steps(args, counter)` that runs every step's regions, its blocks meeting at a
//     grid barrier (an atomic counter) after each region;
//   - for the host (any CPU target, vector width 1): the emulation, `rnnc_emulate(args, region,
//     step, threads, reversed)`, which runs region `region` for each thread in turn (forwards or
//     backwards): the barriers become the ends of these loops. Region -1 is the persistent
//     kernel's steps as block `step` of `threads` one-thread blocks, to be called from that many
//     host threads at once: they meet at the same grid barrier (generations of an atomic counter,
//     at args->team) as the GPU's blocks. Tests run both against the interpreter, so the
//     kernels' indexing, tails, phases and the barrier's counting are checked without a GPU.
// Internal to codegen/.
#pragma once

#include "codegen/GpuPlan.h"
#include "codegen/StoragePlan.h"
#include "codegen/Target.h"
#include "ir/Cell.h"

#include <memory>

namespace llvm {
class LLVMContext;
class Module;
} // namespace llvm

namespace rnnc::codegen {

inline constexpr const char* kGpuRegionPrefix = "rnnc_region_";
inline constexpr const char* kGpuKernelPrefix = "rnnc_kernel_";
inline constexpr const char* kGpuPersistentKernel = "rnnc_steps";
inline constexpr const char* kGpuEmulateFunction = "rnnc_emulate";

// `plan` and `regions` as planned for the GPU; `target` the GPU (the kernels) or a host CPU
// with vector width 1 (the emulation).
std::unique_ptr<llvm::Module> emitGpuCell(llvm::LLVMContext& context, const ir::Cell& cell,
                                          const StoragePlan& plan,
                                          const std::vector<GpuRegion>& regions,
                                          const Target& target);

} // namespace rnnc::codegen

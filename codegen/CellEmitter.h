// Lowers an optimised, size-bound cell to one LLVM function, `rnnc_run(const RnncRunArgs*)`,
// that runs a sequence in phases (codegen/RunArgs.h): the parameter-only work, the pre block over
// T*B rows, then the time loop, each split between the threads of the call. Recurrent products
// fused into their kernel are computed in register tiles; other products call the runtime's
// GEMM; fused kernels become loop nests over explicit float vectors (the target's width, with a
// <1 x float> tail). The emitter itself is codegen/Emitter.h.
#pragma once

#include "codegen/StoragePlan.h"
#include "codegen/Target.h"
#include "ir/Cell.h"

#include <memory>
#include <string>

namespace llvm {
class LLVMContext;
class Module;
} // namespace llvm

namespace rnnc::codegen {

std::unique_ptr<llvm::Module> emitCell(llvm::LLVMContext& context, const ir::Cell& cell,
                                       const StoragePlan& plan, const Target& target,
                                       const std::string& functionName);

} // namespace rnnc::codegen

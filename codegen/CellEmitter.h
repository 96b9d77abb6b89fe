// Lowers an optimised, size-bound cell to one LLVM function, `rnnc_run(const RnncRunArgs*)`,
// that runs the whole sequence: the pre block once over T*B rows, then the time loop. Matrix
// products call the runtime's GEMM; fused kernels become loop nests over explicit float vectors
// (the target's width, with a <1 x float> tail); states are updated at the end of each step.
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

// Lowers an optimised, size-bound cell to one LLVM function, `rnnc_run(const RnncRunArgs*)`,
// that runs a sequence in phases (codegen/RunArgs.h): the parameter-only work, the pre block over
// T*B rows, then the time loop, each split between the threads of the call. Matrix products
// whose weights are known before the loop are computed in register tiles from weights packed
// once (codegen/ProductKernelEmitter.h), fused into their kernel or stored; any other product
// calls the runtime's GEMM; fused kernels become loop nests over explicit float vectors (the
// target's width, with a <1 x float> tail; codegen/KernelEmitter.h). The parts share
// codegen/EmitContext.h.
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

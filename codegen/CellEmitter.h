// Lowers an optimised, size-bound cell to one LLVM function, `rnnc_run(const RnncRunArgs*)`,
// that runs a sequence in phases (codegen/RunArgs.h): the parameter-only work, the pre block over
// T*B rows, then the time loop, each split between the threads of the call. Matrix products
// whose weights are known before the loop are computed in register tiles from weights packed
// once (codegen/ProductKernelEmitter.h), fused into their kernel or stored; any other product
// calls the runtime's GEMM; fused kernels become loop nests over explicit float vectors (the
// target's width, with a <1 x float> tail; codegen/KernelEmitter.h). The parts share
// codegen/EmitContext.h.
//
// The function comes in two parts, each its own module, so that LLVM compiles them side by side
// (codegen/Compiler.cpp; the back end is most of a cold compile and runs on one thread per
// module): the loop part defines `rnnc_run` itself, which calls the setup part,
// `rnnc_run.setup` (the parameter and pre phases), then runs the time loop; the setup part
// also defines the walks over the depth of the products' full-height tiles, the recurrent
// product's included, which the loop calls (EmitContext::TileWalks).
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

enum class CellPart {
  Setup, // setupFunctionName(functionName): the parameter and pre phases, and the tiles' walks
  Loop,  // `functionName`: a call of the setup part, then the time loop
};
std::string setupFunctionName(const std::string& functionName); // functionName + ".setup"

std::unique_ptr<llvm::Module> emitCell(llvm::LLVMContext& context, const ir::Cell& cell,
                                       const StoragePlan& plan, const Target& target,
                                       const std::string& functionName, CellPart part);

} // namespace rnnc::codegen

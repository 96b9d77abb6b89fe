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
// module): the setup part defines `rnnc_run` itself (the parameter and pre phases) and calls the
// loop part, `rnnc_run.loop`, for the time loop.
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
  Setup, // `functionName`: the parameter and pre phases, then a call of the loop part
  Loop,  // loopFunctionName(functionName): the time loop, calling the tiles parts' functions
  // A share of the time loop's outlined tiles (EmitContext::OutlinedTiles): the same loop
  // emitted, then only the tile functions of its share kept
  LoopTiles,
};
// The outlined tiles are shared out between this many LoopTiles parts, the n-th function emitted
// to part n % kLoopTileParts: each a module LLVM compiles beside the others. One: since the
// tiles of every height from half to full became one tile in the loop (emitTile's run-time
// height), what is left outlined is a product's single-row tile (int8: none), and a second share
// compiled an empty module or one single-row tile at no gain on two cores (LSTM, GRU, tanh RNN).
constexpr int kLoopTileParts = 1;
std::string loopFunctionName(const std::string& functionName); // functionName + ".loop"

// `tilesPart`: which share of the tiles a LoopTiles part defines, in [0, kLoopTileParts).
std::unique_ptr<llvm::Module> emitCell(llvm::LLVMContext& context, const ir::Cell& cell,
                                       const StoragePlan& plan, const Target& target,
                                       const std::string& functionName, CellPart part,
                                       int tilesPart = 0);

} // namespace rnnc::codegen

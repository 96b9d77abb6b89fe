// The LLVM optimiser's passes that rnnc's generated modules go through before the back end.
#pragma once

namespace llvm {
class Module;
class TargetMachine;
} // namespace llvm

namespace rnnc::codegen {

// Runs the CPU pipeline (or, for a GPU module, the GPU's) over `module`, for `machine`.
void optimiseModule(llvm::Module& module, llvm::TargetMachine& machine, bool gpu);

} // namespace rnnc::codegen

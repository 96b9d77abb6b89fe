// Our own vectorised exp, log, sigmoid and tanh, emitted as LLVM IR on float vectors of any
// width (including <1 x float> for loop tails). No library calls, so the same code serves every
// target and the loop vectoriser is not needed: LLVM's libm mappings stay scalar for tanhf and
// for 16-lane expf (shared/TOOLCHAIN.md).
//
// Accuracy over all floats (tests/test_codegen_math.cpp sweeps it): sigmoid and tanh within
// 5e-7 absolute, exp and log within a few ulp relative; +-inf, NaN and zero behave as in libm.
#pragma once

namespace llvm {
class Value;
template <typename, typename> class IRBuilder;
class ConstantFolder;
class IRBuilderDefaultInserter;
} // namespace llvm

namespace rnnc::codegen {

using Builder = llvm::IRBuilder<llvm::ConstantFolder, llvm::IRBuilderDefaultInserter>;

llvm::Value* emitExp(Builder& b, llvm::Value* x);
llvm::Value* emitLog(Builder& b, llvm::Value* x);
llvm::Value* emitSigmoid(Builder& b, llvm::Value* x);
llvm::Value* emitTanh(Builder& b, llvm::Value* x);

} // namespace rnnc::codegen

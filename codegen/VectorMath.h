// Our own vectorised exp, log, sigmoid and tanh, emitted as LLVM IR on float vectors of any
// width (including <1 x float> for loop tails). No library calls, so the same code serves every
// target and the loop vectoriser is not needed: LLVM's libm mappings stay scalar for tanhf and
// for 16-lane expf (shared/TOOLCHAIN.md).
//
// Accuracy over all floats (tests/test_vector_math.cpp measures it): sigmoid and tanh within
// 5e-7 absolute; exp and log within a few ulp relative. exp and log give libm's inf, 0 and NaN
// at the edges; sigmoid and tanh reach exactly 0/1 and -1/1 at the far ends and pass NaN
// through.
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

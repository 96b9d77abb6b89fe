// The code generator's part for fused elementwise kernels (over codegen/EmitContext.h): loop
// nests over explicit float vectors, with layer norms computed row by row on the fly. Internal
// to codegen/.
#pragma once

#include "codegen/EmitContext.h"

#include <unordered_map>

namespace rnnc::codegen {

class KernelEmitter {
public:
  explicit KernelEmitter(EmitContext& e) : e(e) {}

  // One loop nest over the kernel's iteration space: rows outside, columns inside in groups of
  // interleaved vectors, then single vectors, then one column at a time.
  void emitKernel(const ir::Block& block, const KernelGroup& group, llvm::Value* batchRows);

  // The views of what the kernel reads from memory, made before its loops.
  void emitViews(const ir::Block& block, const KernelGroup& group);

  // The kernel's whole row r (its `cols` columns), as one iteration of emitKernel's row loop.
  void emitKernelRow(const ir::Block& block, const KernelGroup& group, llvm::Value* r,
                     int64_t cols);

  // The kernel's work at row r, columns [j, j + width). `values`: what is already in registers
  // (the slices of a fused product's tile).
  void emitKernelBody(const ir::Block& block, const KernelGroup& group, llvm::Value* r,
                      llvm::Value* j, int64_t width,
                      std::unordered_map<const ir::Value*, llvm::Value*> values = {});

  static bool isImmediate(const ir::Value* v) {
    return !v->isArgument() && v->def->op == ir::Op::Const;
  }

  static bool definedIn(const ir::Block& block, const KernelGroup& group, const ir::Value* v) {
    for (size_t i = group.first; i < group.last; ++i)
      if (&block[i]->result == v)
        return true;
    return false;
  }

private:
  // A layer norm fused into a kernel: its values are computed where they are read.
  static bool isNormalised(const ir::Value* v) {
    return !v->isArgument() && v->def->op == ir::Op::LayerNorm && v->def->kernel >= 0;
  }

  // Sum over columns [0, n) of row r of `x`, each element mapped by `f`: vector lanes, then the
  // rest one at a time, accumulated in stack slots that LLVM promotes to registers.
  template <class F> llvm::Value* rowSum(const View& x, llvm::Value* r, int64_t n, F&& f);

  struct RowStatistics {
    llvm::Value* mean = nullptr;
    llvm::Value* inverseStd = nullptr;
  };

  // Mean and 1/sqrt(var + eps) of row r, in two passes (one pass of sum and sum of squares
  // cancels badly when the mean is large; PyTorch is careful here too).
  RowStatistics emitRowStatistics(const ir::Instr& norm, llvm::Value* r);

  // The normalised values of `norm` (a fused layer norm) at columns offset + j onwards.
  llvm::Value* normalised(const ir::Value* norm, llvm::Value* r, llvm::Value* j, int64_t offset,
                          int64_t width);

  template <class Get> llvm::Value* compute(const ir::Instr& instr, Get& get, llvm::Type* vec);

  EmitContext& e;
  std::unordered_map<const ir::Value*, RowStatistics> rowStatistics_; // of the current row
};

} // namespace rnnc::codegen

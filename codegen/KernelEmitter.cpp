// Fused elementwise kernels: loop nests over explicit float vectors, with layer norms computed
// row by row on the fly.
#include "codegen/KernelEmitter.h"

#include "codegen/VectorMath.h"
#include "ir/Error.h"
#include "ir/ShapeInference.h"

#include <algorithm>

namespace rnnc::codegen {

using ir::Op;

void KernelEmitter::emitViews(const ir::Block& block, const KernelGroup& group) {
  for (size_t i = group.first; i < group.last; ++i) {
    for (const ir::Value* operand : block[i]->operands)
      if (!definedIn(block, group, operand) && !isImmediate(operand))
        e.view(operand);
    if (block[i]->op == Op::Slice && !isNormalised(block[i]->operands[0]))
      e.view(&block[i]->result);
  }
}

// One loop nest over the kernel's iteration space [R, F]: rows outside, columns inside.
void KernelEmitter::emitKernel(const ir::Block& block, const KernelGroup& group,
                               llvm::Value* batchRows) {
  const KernelSpace space = kernelSpace(block, group);
  RowRange rows =
      space.batched ? e.share(batchRows) : e.firstThreadOnly(e.constant(space.fixedRows));
  // Views are computed before the loops so that their address arithmetic is not repeated.
  emitViews(block, group);
  e.forLoop(rows.begin, rows.end, e.constant(1), "row",
            [&](llvm::Value* r) { emitKernelRow(block, group, r, space.cols); });
}

// Row r: its layer norms' statistics, then columns in groups of interleaved vectors, then
// single vectors of the target's width, then the remaining columns one at a time.
void KernelEmitter::emitKernelRow(const ir::Block& block, const KernelGroup& group, llvm::Value* r,
                                  int64_t cols) {
  for (size_t i = group.first; i < group.last; ++i)
    if (block[i]->op == Op::LayerNorm)
      rowStatistics_[&block[i]->result] = emitRowStatistics(*block[i], r);
  const int64_t width = e.target.vectorWidth;
  const int64_t widths[] = {width * e.target.interleavedVectors, width, 1};
  int64_t done = 0; // columns covered by the wider loops before
  for (int64_t w : widths) {
    const int64_t end = cols - cols % w;
    if (end > done)
      e.forLoop(e.constant(done), e.constant(end), e.constant(w), "col",
                [&](llvm::Value* j) { emitKernelBody(block, group, r, j, w); });
    done = std::max(done, end);
  }
}

// Sum over columns [0, n) of row r of `x`, each element mapped by `f`: vector lanes, then the
// rest one at a time, accumulated in stack slots that LLVM promotes to registers.
template <class F>
llvm::Value* KernelEmitter::rowSum(const View& x, llvm::Value* r, int64_t n, F&& f) {
  const int64_t width = e.target.vectorWidth;
  llvm::Type* vec = llvm::FixedVectorType::get(e.f32, static_cast<unsigned>(width));
  llvm::IRBuilder<> entry(&e.fn->getEntryBlock(), e.fn->getEntryBlock().begin());
  llvm::AllocaInst* lanes = entry.CreateAlloca(vec);
  llvm::AllocaInst* rest = entry.CreateAlloca(e.f32);
  e.b.CreateStore(llvm::ConstantFP::get(vec, 0.0), lanes);
  e.b.CreateStore(llvm::ConstantFP::get(e.f32, 0.0), rest);
  const int64_t vectorCols = n - n % width;
  if (vectorCols > 0)
    e.forLoop(e.constant(0), e.constant(vectorCols), e.constant(width), "sum", [&](llvm::Value* j) {
      llvm::Value* v = f(e.b.CreateAlignedLoad(vec, e.elementPointer(x, r, j), llvm::Align(4)));
      e.b.CreateStore(e.b.CreateFAdd(e.b.CreateLoad(vec, lanes), v), lanes);
    });
  if (vectorCols < n)
    e.forLoop(e.constant(vectorCols), e.constant(n), e.constant(1), "sumtail", [&](llvm::Value* j) {
      llvm::Value* v = f(e.b.CreateAlignedLoad(e.f32, e.elementPointer(x, r, j), llvm::Align(4)));
      e.b.CreateStore(e.b.CreateFAdd(e.b.CreateLoad(e.f32, rest), v), rest);
    });
  llvm::Value* reduced =
      e.b.CreateFAddReduce(llvm::ConstantFP::get(e.f32, 0.0), e.b.CreateLoad(vec, lanes));
  llvm::cast<llvm::Instruction>(reduced)->setHasAllowReassoc(true);
  return e.b.CreateFAdd(reduced, e.b.CreateLoad(e.f32, rest));
}

// Mean and 1/sqrt(var + eps) of row r, in two passes (one pass of sum and sum of squares
// cancels badly when the mean is large; PyTorch is careful here too).
KernelEmitter::RowStatistics KernelEmitter::emitRowStatistics(const ir::Instr& norm,
                                                              llvm::Value* r) {
  const ir::Value* x = norm.operands[0];
  const int64_t n = columnsOf(x);
  View in = e.view(x);
  llvm::Value* count = llvm::ConstantFP::get(e.f32, static_cast<double>(n));
  llvm::Value* mean = e.b.CreateFDiv(rowSum(in, r, n, [](llvm::Value* v) { return v; }), count);
  auto squaredDeviation = [&](llvm::Value* v) {
    llvm::Value* m = mean;
    if (auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(v->getType()))
      m = e.b.CreateVectorSplat(vt->getNumElements(), mean);
    llvm::Value* d = e.b.CreateFSub(v, m);
    return e.b.CreateFMul(d, d);
  };
  llvm::Value* variance = e.b.CreateFDiv(rowSum(in, r, n, squaredDeviation), count);
  llvm::Value* std = e.b.CreateIntrinsic(
      llvm::Intrinsic::sqrt, {e.f32},
      {e.b.CreateFAdd(variance, llvm::ConstantFP::get(e.f32, norm.attrs.value))});
  return {mean, e.b.CreateFDiv(llvm::ConstantFP::get(e.f32, 1.0), std)};
}

// The normalised values of `norm` (a fused layer norm) at columns offset + j onwards.
llvm::Value* KernelEmitter::normalised(const ir::Value* norm, llvm::Value* r, llvm::Value* j,
                                       int64_t offset, int64_t width) {
  const RowStatistics& stats = rowStatistics_.at(norm);
  llvm::Type* vec = llvm::FixedVectorType::get(e.f32, static_cast<unsigned>(width));
  llvm::Value* column = e.b.CreateAdd(j, e.constant(offset));
  llvm::Value* x = e.b.CreateAlignedLoad(
      vec, e.elementPointer(e.view(norm->def->operands[0]), r, column), llvm::Align(4));
  auto splat = [&](llvm::Value* s) {
    return e.b.CreateVectorSplat(static_cast<unsigned>(width), s);
  };
  return e.b.CreateFMul(e.b.CreateFSub(x, splat(stats.mean)), splat(stats.inverseStd));
}

// `values`: what is already in registers (the slices of a fused product's tile).
void KernelEmitter::emitKernelBody(const ir::Block& block, const KernelGroup& group, llvm::Value* r,
                                   llvm::Value* j, int64_t width,
                                   std::unordered_map<const ir::Value*, llvm::Value*> values) {
  llvm::Type* vec = llvm::FixedVectorType::get(e.f32, static_cast<unsigned>(width));
  auto splat = [&](double v) { return llvm::ConstantFP::get(vec, v); };
  auto load = [&](const ir::Value* v) -> llvm::Value* {
    View at = e.view(v);
    if (v->shape.empty()) // a scalar in memory: one float for every lane
      return e.b.CreateVectorSplat(static_cast<unsigned>(width),
                                   e.b.CreateAlignedLoad(e.f32, at.base, llvm::Align(4)));
    return e.b.CreateAlignedLoad(vec, e.elementPointer(at, r, j), llvm::Align(4));
  };
  auto get = [&](const ir::Value* v) -> llvm::Value* {
    if (auto it = values.find(v); it != values.end())
      return it->second;
    llvm::Value* loaded = isImmediate(v) ? splat(v->def->attrs.value) : load(v);
    values[v] = loaded;
    return loaded;
  };
  for (size_t i = group.first; i < group.last; ++i) {
    const ir::Instr& instr = *block[i];
    if (values.count(&instr.result) || e.plan.packedProductOf(&instr))
      continue; // in registers already
    llvm::Value* result = nullptr;
    if (instr.op == Op::LayerNorm)
      result = normalised(&instr.result, r, j, 0, width);
    else if (instr.op == Op::Slice && isNormalised(instr.operands[0]))
      result = normalised(instr.operands[0], r, j, instr.attrs.offset.constantValue(), width);
    else if (instr.op == Op::Slice)
      result = load(&instr.result);
    else
      result = compute(instr, get, vec);
    values[&instr.result] = result;
    for (size_t u = 0; u < e.cell.updates.size(); ++u)
      if (e.plan.updatedInKernel[u] && e.cell.updates[u].next == &instr.result)
        e.b.CreateAlignedStore(result, e.elementPointer(e.views.at(e.cell.states[u].get()), r, j),
                               llvm::Align(4));
    if (e.views.count(&instr.result) && instr.op != Op::Slice) {
      View out = e.views.at(&instr.result);
      llvm::Value* at = instr.result.shape.empty() ? out.base : e.elementPointer(out, r, j);
      llvm::Value* stored = result;
      if (instr.result.shape.empty())
        stored = e.b.CreateExtractElement(result, uint64_t{0});
      e.b.CreateAlignedStore(stored, at, llvm::Align(4));
    }
  }
}

template <class Get>
llvm::Value* KernelEmitter::compute(const ir::Instr& instr, Get& get, llvm::Type* vec) {
  auto operand = [&](size_t k) { return get(instr.operands[k]); };
  auto intrinsic2 = [&](llvm::Intrinsic::ID id, llvm::Value* x, llvm::Value* y) {
    return e.b.CreateIntrinsic(id, {vec}, {x, y});
  };
  const ir::Attrs& a = instr.attrs;
  switch (instr.op) {
  case Op::Const:
    return llvm::ConstantFP::get(vec, a.value);
  case Op::Add:
    return e.b.CreateFAdd(operand(0), operand(1));
  case Op::Sub:
    return e.b.CreateFSub(operand(0), operand(1));
  case Op::Mul:
    return e.b.CreateFMul(operand(0), operand(1));
  case Op::Div:
    return e.b.CreateFDiv(operand(0), operand(1));
  case Op::Min: // llvm.minimum/maximum propagate NaN, as torch.minimum/maximum do
    return intrinsic2(llvm::Intrinsic::minimum, operand(0), operand(1));
  case Op::Max:
    return intrinsic2(llvm::Intrinsic::maximum, operand(0), operand(1));
  case Op::Neg:
    return e.b.CreateFNeg(operand(0));
  case Op::Step: { // 1 where x > 0, 0 where not, NaN stays NaN (an unordered compare)
    llvm::Value* x = operand(0);
    llvm::Value *one = llvm::ConstantFP::get(vec, 1.0), *zero = llvm::ConstantFP::get(vec, 0.0);
    llvm::Value* positive = e.b.CreateSelect(e.b.CreateFCmpOGT(x, zero), one, zero);
    return e.b.CreateSelect(e.b.CreateFCmpUNO(x, x), x, positive);
  }
  case Op::Relu:
    return intrinsic2(llvm::Intrinsic::maximum, operand(0), llvm::ConstantFP::get(vec, 0.0));
  case Op::Clamp:
    return intrinsic2(
        llvm::Intrinsic::minimum,
        intrinsic2(llvm::Intrinsic::maximum, operand(0), llvm::ConstantFP::get(vec, a.lo)),
        llvm::ConstantFP::get(vec, a.hi));
  case Op::Sqrt:
    return e.b.CreateIntrinsic(llvm::Intrinsic::sqrt, {vec}, {operand(0)});
  case Op::Exp:
    return emitExp(e.b, operand(0));
  case Op::Log:
    return emitLog(e.b, operand(0));
  case Op::Sigmoid:
    return emitSigmoid(e.b, operand(0));
  case Op::Tanh:
    return emitTanh(e.b, operand(0));
  case Op::Dropout:
    return operand(0); // inference: identity (training makes masks explicit: dropout_mask)
  // Not elementwise: views, copies, products and layer norms are computed outside this switch.
  // No default: a new op in Ops.def is a compile error (-Werror=switch) until it is placed.
  case Op::Slice:
  case Op::Concat:
  case Op::Stack:
  case Op::Linear:
  case Op::MatMul:
  case Op::LayerNorm:
  case Op::LayerNormGrad:
  case Op::DropoutMask:
    break;
  }
  RNNC_INTERNAL_CHECK(false, "no kernel code for " + std::string(ir::opName(instr.op)));
  return nullptr;
}

} // namespace rnnc::codegen

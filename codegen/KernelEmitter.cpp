// Fused elementwise kernels: loop nests over explicit float vectors, with layer norms computed
// row by row on the fly.
#include "codegen/Emitter.h"

#include "codegen/VectorMath.h"
#include "ir/Error.h"
#include "ir/ShapeInference.h"

#include <algorithm>

namespace rnnc::codegen {

using ir::Op;

// One loop nest over the kernel's iteration space [R, F]: rows outside, columns inside in groups
// of interleaved vectors, then single vectors of the target's width, then the remaining columns
// one at a time.
void Emitter::emitKernel(const ir::Block& block, const KernelGroup& group, llvm::Value* batchRows) {
  if (const PackedProduct* packed = plan_.packedProductOf(block[group.first].get()))
    return emitProductKernel(block, &group, *packed, batchRows);
  ir::Shape space;
  for (size_t i = group.first; i < group.last; ++i) {
    if (block[i]->op == Op::LayerNorm)
      continue; // normalised on the fly: it does not set the iteration space
    auto widened = ir::broadcastShapes(space, block[i]->result.shape);
    RNNC_INTERNAL_CHECK(widened.has_value(), "kernel members do not share an iteration space");
    space = *widened;
  }
  bool batched = ir::hasBatch(space);
  int64_t rowsFixed = 1;
  for (size_t d = 0; d + 1 < space.size(); ++d)
    if (!batched)
      rowsFixed *= space[d].constantValue();
  RowRange rows = batched ? share(batchRows) : firstThreadOnly(constant(rowsFixed));
  const int64_t cols = space.empty() ? 1 : space.back().constantValue();
  const int64_t width = target_.vectorWidth;
  const int64_t widths[] = {width * target_.interleavedVectors, width, 1};

  // Views are computed before the loops so that their address arithmetic is not repeated.
  for (size_t i = group.first; i < group.last; ++i) {
    for (const ir::Value* operand : block[i]->operands)
      if (!definedIn(block, group, operand) && !isImmediate(operand))
        view(operand);
    if (block[i]->op == Op::Slice && !isNormalised(block[i]->operands[0]))
      view(&block[i]->result);
  }
  forLoop(rows.begin, rows.end, constant(1), "row", [&](llvm::Value* r) {
    for (size_t i = group.first; i < group.last; ++i)
      if (block[i]->op == Op::LayerNorm)
        rowStatistics_[&block[i]->result] = emitRowStatistics(*block[i], r);
    int64_t done = 0; // columns covered by the wider loops before
    for (int64_t w : widths) {
      const int64_t end = cols - cols % w;
      if (end > done)
        forLoop(constant(done), constant(end), constant(w), "col",
                [&](llvm::Value* j) { emitKernelBody(block, group, r, j, w); });
      done = std::max(done, end);
    }
  });
}

// Sum over columns [0, n) of row r of `x`, each element mapped by `f`: vector lanes, then the
// rest one at a time, accumulated in stack slots that LLVM promotes to registers.
template <class F> llvm::Value* Emitter::rowSum(const View& x, llvm::Value* r, int64_t n, F&& f) {
  const int64_t width = target_.vectorWidth;
  llvm::Type* vec = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(width));
  llvm::IRBuilder<> entry(&fn_->getEntryBlock(), fn_->getEntryBlock().begin());
  llvm::AllocaInst* lanes = entry.CreateAlloca(vec);
  llvm::AllocaInst* rest = entry.CreateAlloca(f32_);
  b_.CreateStore(llvm::ConstantFP::get(vec, 0.0), lanes);
  b_.CreateStore(llvm::ConstantFP::get(f32_, 0.0), rest);
  const int64_t vectorCols = n - n % width;
  if (vectorCols > 0)
    forLoop(constant(0), constant(vectorCols), constant(width), "sum", [&](llvm::Value* j) {
      llvm::Value* v = f(b_.CreateAlignedLoad(vec, elementPointer(x, r, j), llvm::Align(4)));
      b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(vec, lanes), v), lanes);
    });
  if (vectorCols < n)
    forLoop(constant(vectorCols), constant(n), constant(1), "sumtail", [&](llvm::Value* j) {
      llvm::Value* v = f(b_.CreateAlignedLoad(f32_, elementPointer(x, r, j), llvm::Align(4)));
      b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(f32_, rest), v), rest);
    });
  llvm::Value* reduced =
      b_.CreateFAddReduce(llvm::ConstantFP::get(f32_, 0.0), b_.CreateLoad(vec, lanes));
  llvm::cast<llvm::Instruction>(reduced)->setHasAllowReassoc(true);
  return b_.CreateFAdd(reduced, b_.CreateLoad(f32_, rest));
}

// Mean and 1/sqrt(var + eps) of row r, in two passes (one pass of sum and sum of squares
// cancels badly when the mean is large; PyTorch is careful here too).
Emitter::RowStatistics Emitter::emitRowStatistics(const ir::Instr& norm, llvm::Value* r) {
  const ir::Value* x = norm.operands[0];
  const int64_t n = columnsOf(x);
  View in = view(x);
  llvm::Value* count = llvm::ConstantFP::get(f32_, static_cast<double>(n));
  llvm::Value* mean = b_.CreateFDiv(rowSum(in, r, n, [](llvm::Value* v) { return v; }), count);
  auto squaredDeviation = [&](llvm::Value* v) {
    llvm::Value* m = mean;
    if (auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(v->getType()))
      m = b_.CreateVectorSplat(vt->getNumElements(), mean);
    llvm::Value* d = b_.CreateFSub(v, m);
    return b_.CreateFMul(d, d);
  };
  llvm::Value* variance = b_.CreateFDiv(rowSum(in, r, n, squaredDeviation), count);
  llvm::Value* std =
      b_.CreateIntrinsic(llvm::Intrinsic::sqrt, {f32_},
                         {b_.CreateFAdd(variance, llvm::ConstantFP::get(f32_, norm.attrs.value))});
  return {mean, b_.CreateFDiv(llvm::ConstantFP::get(f32_, 1.0), std)};
}

// The normalised values of `norm` (a fused layer norm) at columns offset + j onwards.
llvm::Value* Emitter::normalised(const ir::Value* norm, llvm::Value* r, llvm::Value* j,
                                 int64_t offset, int64_t width) {
  const RowStatistics& stats = rowStatistics_.at(norm);
  llvm::Type* vec = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(width));
  llvm::Value* column = b_.CreateAdd(j, constant(offset));
  llvm::Value* x = b_.CreateAlignedLoad(
      vec, elementPointer(view(norm->def->operands[0]), r, column), llvm::Align(4));
  auto splat = [&](llvm::Value* s) {
    return b_.CreateVectorSplat(static_cast<unsigned>(width), s);
  };
  return b_.CreateFMul(b_.CreateFSub(x, splat(stats.mean)), splat(stats.inverseStd));
}

// `values`: what is already in registers (the slices of a fused product's tile).
void Emitter::emitKernelBody(const ir::Block& block, const KernelGroup& group, llvm::Value* r,
                             llvm::Value* j, int64_t width,
                             std::unordered_map<const ir::Value*, llvm::Value*> values) {
  llvm::Type* vec = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(width));
  auto splat = [&](double v) { return llvm::ConstantFP::get(vec, v); };
  auto load = [&](const ir::Value* v) -> llvm::Value* {
    View at = view(v);
    if (v->shape.empty()) // a scalar in memory: one float for every lane
      return b_.CreateVectorSplat(static_cast<unsigned>(width),
                                  b_.CreateAlignedLoad(f32_, at.base, llvm::Align(4)));
    return b_.CreateAlignedLoad(vec, elementPointer(at, r, j), llvm::Align(4));
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
    if (values.count(&instr.result) || plan_.packedProductOf(&instr))
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
    for (size_t u = 0; u < cell_.updates.size(); ++u)
      if (plan_.updatedInKernel[u] && cell_.updates[u].next == &instr.result)
        b_.CreateAlignedStore(result, elementPointer(views_.at(cell_.states[u].get()), r, j),
                              llvm::Align(4));
    if (views_.count(&instr.result) && instr.op != Op::Slice) {
      View out = views_.at(&instr.result);
      llvm::Value* at = instr.result.shape.empty() ? out.base : elementPointer(out, r, j);
      llvm::Value* stored = result;
      if (instr.result.shape.empty())
        stored = b_.CreateExtractElement(result, uint64_t{0});
      b_.CreateAlignedStore(stored, at, llvm::Align(4));
    }
  }
}

template <class Get>
llvm::Value* Emitter::compute(const ir::Instr& instr, Get& get, llvm::Type* vec) {
  auto operand = [&](size_t k) { return get(instr.operands[k]); };
  auto intrinsic2 = [&](llvm::Intrinsic::ID id, llvm::Value* x, llvm::Value* y) {
    return b_.CreateIntrinsic(id, {vec}, {x, y});
  };
  const ir::Attrs& a = instr.attrs;
  switch (instr.op) {
  case Op::Const:
    return llvm::ConstantFP::get(vec, a.value);
  case Op::Add:
    return b_.CreateFAdd(operand(0), operand(1));
  case Op::Sub:
    return b_.CreateFSub(operand(0), operand(1));
  case Op::Mul:
    return b_.CreateFMul(operand(0), operand(1));
  case Op::Div:
    return b_.CreateFDiv(operand(0), operand(1));
  case Op::Min: // llvm.minimum/maximum propagate NaN, as torch.minimum/maximum do
    return intrinsic2(llvm::Intrinsic::minimum, operand(0), operand(1));
  case Op::Max:
    return intrinsic2(llvm::Intrinsic::maximum, operand(0), operand(1));
  case Op::Neg:
    return b_.CreateFNeg(operand(0));
  case Op::Relu:
    return intrinsic2(llvm::Intrinsic::maximum, operand(0), llvm::ConstantFP::get(vec, 0.0));
  case Op::Clamp:
    return intrinsic2(
        llvm::Intrinsic::minimum,
        intrinsic2(llvm::Intrinsic::maximum, operand(0), llvm::ConstantFP::get(vec, a.lo)),
        llvm::ConstantFP::get(vec, a.hi));
  case Op::Sqrt:
    return b_.CreateIntrinsic(llvm::Intrinsic::sqrt, {vec}, {operand(0)});
  case Op::Exp:
    return emitExp(b_, operand(0));
  case Op::Log:
    return emitLog(b_, operand(0));
  case Op::Sigmoid:
    return emitSigmoid(b_, operand(0));
  case Op::Tanh:
    return emitTanh(b_, operand(0));
  case Op::Dropout:
    return operand(0); // inference: identity (training runs on the interpreter)
  default:
    RNNC_INTERNAL_CHECK(false, "no kernel code for " + std::string(ir::opName(instr.op)));
  }
}

} // namespace rnnc::codegen

#include "codegen/VectorMath.h"

#include "codegen/LLVMHeaders.h"

#include <limits>

namespace rnnc::codegen {
namespace {

llvm::Value* splat(Builder& b, llvm::Value* like, float value) {
  return llvm::ConstantFP::get(like->getType(), value);
}

llvm::Value* splatInt(Builder& b, llvm::Type* intVector, int32_t value) {
  return llvm::ConstantInt::get(intVector, static_cast<uint64_t>(static_cast<int64_t>(value)),
                                true);
}

llvm::Type* intVectorLike(llvm::Value* x) {
  auto* vec = llvm::cast<llvm::FixedVectorType>(x->getType());
  return llvm::FixedVectorType::get(llvm::Type::getInt32Ty(x->getContext()), vec->getNumElements());
}

llvm::Value* fma(Builder& b, llvm::Value* x, llvm::Value* y, llvm::Value* z) {
  return b.CreateIntrinsic(llvm::Intrinsic::fma, {x->getType()}, {x, y, z});
}

// Horner's rule with fused multiply-adds: c[0]*x^n + ... + c[n].
llvm::Value* polynomial(Builder& b, llvm::Value* x, std::initializer_list<float> coefficients) {
  auto it = coefficients.begin();
  llvm::Value* acc = splat(b, x, *it++);
  for (; it != coefficients.end(); ++it)
    acc = fma(b, acc, x, splat(b, x, *it));
  return acc;
}

// exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2] (Cody-Waite
// split of ln 2), exp(r) by a degree-6 polynomial (Cephes expf), 2^n built in the exponent bits.
// The clamps are compare-and-select, not minnum/maxnum, so a NaN argument stays NaN all the way
// through at no cost.
//
// `exactLimits` (the exp op): the whole float range. x is clamped to [-103.97, 88.72], 2^n is
// applied as two factors 2^(n/2) 2^(n - n/2) so that n = 128 and denormal results work, and
// past the clamps the result is exactly inf or 0. Without it (inside sigmoid and tanh, whose
// results saturate long before): x is clamped to [-87.3, 88.3], one factor, nothing else.
llvm::Value* emitExpCore(Builder& b, llvm::Value* x, bool exactLimits) {
  llvm::Type* ivec = intVectorLike(x);
  llvm::Value* lo = splat(b, x, exactLimits ? -103.972084045410f : -87.3f);
  llvm::Value* hi = splat(b, x, exactLimits ? 88.72283935546875f : 88.3f);
  llvm::Value* clamped = b.CreateSelect(b.CreateFCmpOLT(x, lo), lo, x);
  clamped = b.CreateSelect(b.CreateFCmpOGT(clamped, hi), hi, clamped);
  llvm::Value* n = b.CreateIntrinsic(llvm::Intrinsic::rint, {x->getType()},
                                     {b.CreateFMul(clamped, splat(b, x, 1.44269504088896341f))});
  llvm::Value* r = fma(b, n, splat(b, x, -0.693359375f), clamped);
  r = fma(b, n, splat(b, x, 2.12194440e-4f), r);
  llvm::Value* p = polynomial(b, r,
                              {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                               4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f});
  llvm::Value* r2 = b.CreateFMul(r, r);
  llvm::Value* expR = b.CreateFAdd(fma(b, p, r2, r), splat(b, x, 1.0f));
  auto powerOfTwo = [&](llvm::Value* exponent) { // 2^e for e in [-126, 127]
    return b.CreateBitCast(b.CreateShl(b.CreateAdd(exponent, splatInt(b, ivec, 127)), 23),
                           x->getType());
  };
  llvm::Value* ni = b.CreateFPToSI(n, ivec);
  if (!exactLimits)
    return b.CreateFMul(expR, powerOfTwo(ni));
  llvm::Value* half = b.CreateAShr(ni, 1);
  llvm::Value* result =
      b.CreateFMul(b.CreateFMul(expR, powerOfTwo(half)), powerOfTwo(b.CreateSub(ni, half)));
  float inf = std::numeric_limits<float>::infinity();
  result = b.CreateSelect(b.CreateFCmpOGT(x, hi), splat(b, x, inf), result);
  return b.CreateSelect(b.CreateFCmpOLT(x, lo), splat(b, x, 0.0f), result);
}

} // namespace

llvm::Value* emitExp(Builder& b, llvm::Value* x) {
  return emitExpCore(b, x, true);
}

// log(x) = e ln 2 + log(m), x = m 2^e with m in [sqrt(1/2), sqrt(2)) (Cephes logf). Denormals
// are scaled into the normal range first.
llvm::Value* emitLog(Builder& b, llvm::Value* x) {
  llvm::Type* ivec = intVectorLike(x);
  llvm::Value* denormal = b.CreateFCmpOLT(x, splat(b, x, 1.17549435e-38f));
  llvm::Value* scaled = b.CreateSelect(denormal, b.CreateFMul(x, splat(b, x, 8388608.0f)), x);
  llvm::Value* bits = b.CreateBitCast(scaled, ivec);
  llvm::Value* exponent = b.CreateSub(b.CreateLShr(bits, 23), splatInt(b, ivec, 126));
  exponent = b.CreateSelect(denormal, b.CreateSub(exponent, splatInt(b, ivec, 23)), exponent);
  // Mantissa in [0.5, 1).
  llvm::Value* m = b.CreateBitCast(
      b.CreateOr(b.CreateAnd(bits, splatInt(b, ivec, 0x007fffff)), splatInt(b, ivec, 0x3f000000)),
      x->getType());
  llvm::Value* e = b.CreateSIToFP(exponent, x->getType());
  llvm::Value* small = b.CreateFCmpOLT(m, splat(b, x, 0.707106781186547524f));
  e = b.CreateSelect(small, b.CreateFSub(e, splat(b, x, 1.0f)), e);
  m = b.CreateSelect(small, b.CreateFAdd(m, m), m);
  llvm::Value* f = b.CreateFSub(m, splat(b, x, 1.0f));
  llvm::Value* z = b.CreateFMul(f, f);
  llvm::Value* p = polynomial(b, f,
                              {7.0376836292E-2f, -1.1514610310E-1f, 1.1676998740E-1f,
                               -1.2420140846E-1f, 1.4249322787E-1f, -1.6668057665E-1f,
                               2.0000714765E-1f, -2.4999993993E-1f, 3.3333331174E-1f});
  llvm::Value* y = b.CreateFMul(b.CreateFMul(p, f), z);
  y = fma(b, e, splat(b, x, -2.12194440e-4f), y);
  y = fma(b, z, splat(b, x, -0.5f), y);
  llvm::Value* result = b.CreateFAdd(f, y);
  result = fma(b, e, splat(b, x, 0.693359375f), result);
  float inf = std::numeric_limits<float>::infinity();
  float nan = std::numeric_limits<float>::quiet_NaN();
  result = b.CreateSelect(b.CreateFCmpOEQ(x, splat(b, x, inf)), x, result);
  result = b.CreateSelect(b.CreateFCmpOEQ(x, splat(b, x, 0.0f)), splat(b, x, -inf), result);
  // Negative numbers and NaN give NaN.
  return b.CreateSelect(b.CreateFCmpULT(x, splat(b, x, 0.0f)), splat(b, x, nan), result);
}

// sigmoid(x) = 1 / (1 + exp(-x)): for large x exp(-x) is about 0 and the result 1; below -87.3
// the true value is under 1.2e-38 and we return 0.
llvm::Value* emitSigmoid(Builder& b, llvm::Value* x) {
  llvm::Value* e = emitExpCore(b, b.CreateFNeg(x), false);
  llvm::Value* result = b.CreateFDiv(splat(b, x, 1.0f), b.CreateFAdd(splat(b, x, 1.0f), e));
  // Exactly 0 where the true value is below the smallest normal float, as PyTorch gives.
  return b.CreateSelect(b.CreateFCmpOLT(x, splat(b, x, -87.3f)), splat(b, x, 0.0f), result);
}

// tanh(x) = 1 - 2 / (exp(2x) + 1): one exp and one division, -1 and +1 at the far ends. The
// absolute error stays below 2e-7 everywhere (near 0 the subtraction cancels, but only to the
// size of float rounding of 1); a relative-accuracy polynomial near 0 is not worth its cost here.
llvm::Value* emitTanh(Builder& b, llvm::Value* x) {
  llvm::Value* e = emitExpCore(b, b.CreateFAdd(x, x), false);
  return b.CreateFSub(splat(b, x, 1.0f),
                      b.CreateFDiv(splat(b, x, 2.0f), b.CreateFAdd(e, splat(b, x, 1.0f))));
}

} // namespace rnnc::codegen

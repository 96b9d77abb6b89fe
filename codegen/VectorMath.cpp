#include "codegen/VectorMath.h"

#include "codegen/LLVMIRHeaders.h"

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

// 2^t, t = x * scale, for sigmoid and tanh, whose results need only absolute accuracy. x is
// clamped so that t stays in about [-127.4, 127.9]: round(t) is then -127 at the low end, where
// 2^t comes out as exactly 0, and 128 at the high end, +inf, so that the formulas below
// saturate to exact 0, 1 and -1 with no further compare. n = round(t) and the float 2^n both
// come from one fused multiply-add: adding 1.5 * 2^23 + 127 to x * scale leaves n + 127 in the
// low mantissa bits, and shifting them into the exponent field gives 2^n; f = x * scale - n,
// in [-1/2, 1/2], is another, exact to one rounding. 2^f is a degree-5 polynomial (a minimax fit
// of the relative error, 2e-7 in float arithmetic; scripts/fit_exp2.py). Compared with the exp
// op there is no Cody-Waite split of ln 2: an error in t of 6e-8 |t| changes 2^t relatively
// by as much, but sigmoid and tanh scale that by s (1 - s), about 2^-|t|, which leaves under
// 3e-8.
llvm::Value* emitSaturatingExp2(Builder& b, llvm::Value* x, float scale) {
  const float lowT = -127.4f, highT = 127.9f;
  llvm::Value* lo = splat(b, x, (scale > 0 ? lowT : highT) / scale);
  llvm::Value* hi = splat(b, x, (scale > 0 ? highT : lowT) / scale);
  x = b.CreateSelect(b.CreateFCmpOLT(x, lo), lo, x); // selects, not minnum: NaN stays NaN
  x = b.CreateSelect(b.CreateFCmpOGT(x, hi), hi, x);
  llvm::Value* factor = splat(b, x, scale);
  llvm::Value* shifter = splat(b, x, 12582912.0f + 127.0f);
  llvm::Value* shifted = fma(b, x, factor, shifter);
  llvm::Value* f = fma(b, x, factor, b.CreateFNeg(b.CreateFSub(shifted, shifter)));
  llvm::Value* q = polynomial(
      b, f,
      {1.324515557e-03f, 9.668957442e-03f, 5.550770089e-02f, 2.402228415e-01f, 6.931469440e-01f});
  llvm::Value* twoToF = fma(b, q, f, splat(b, x, 1.0f)); // exactly 1 at f = 0
  llvm::Value* twoToN =
      b.CreateBitCast(b.CreateShl(b.CreateBitCast(shifted, intVectorLike(x)), 23), x->getType());
  return b.CreateFMul(twoToF, twoToN);
}

} // namespace

// exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2] (Cody-Waite
// split of ln 2), exp(r) by a degree-6 polynomial (Cephes expf), 2^n built in the exponent bits.
// The clamps are compare-and-select, not minnum/maxnum, so a NaN argument stays NaN all the way
// through at no cost.
//
// Over the whole float range: x is clamped to [-103.97, 88.72], 2^n is applied as two factors
// 2^(n/2) 2^(n - n/2) so that n = 128 and denormal results work, and past the clamps the result
// is exactly inf or 0.
llvm::Value* emitExp(Builder& b, llvm::Value* x) {
  llvm::Type* ivec = intVectorLike(x);
  llvm::Value* lo = splat(b, x, -103.972084045410f);
  llvm::Value* hi = splat(b, x, 88.72283935546875f);
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
  llvm::Value* half = b.CreateAShr(ni, 1);
  llvm::Value* result =
      b.CreateFMul(b.CreateFMul(expR, powerOfTwo(half)), powerOfTwo(b.CreateSub(ni, half)));
  float inf = std::numeric_limits<float>::infinity();
  result = b.CreateSelect(b.CreateFCmpOGT(x, hi), splat(b, x, inf), result);
  return b.CreateSelect(b.CreateFCmpOLT(x, lo), splat(b, x, 0.0f), result);
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

// sigmoid(x) = 1 / (1 + 2^(-x log2 e)): exactly 1 for large x and 0 below about -88.4, where
// 2^t is +inf; between -88.4 and -87.7 the result is a denormal, as libm's gives.
llvm::Value* emitSigmoid(Builder& b, llvm::Value* x) {
  llvm::Value* e = emitSaturatingExp2(b, x, -1.44269504088896341f);
  return b.CreateFDiv(splat(b, x, 1.0f), b.CreateFAdd(splat(b, x, 1.0f), e));
}

// tanh(x) = 1 - 2 / (2^(2x log2 e) + 1): one exp2 and one division, exactly -1 and +1 at the far
// ends and 0 at 0. Near 0 the subtraction cancels, but only to the size of float rounding of 1:
// the absolute error stays within 5e-7; a relative-accuracy polynomial near 0 is not worth its
// cost here.
llvm::Value* emitTanh(Builder& b, llvm::Value* x) {
  llvm::Value* e = emitSaturatingExp2(b, x, 2.88539008177792682f);
  return b.CreateFSub(splat(b, x, 1.0f),
                      b.CreateFDiv(splat(b, x, 2.0f), b.CreateFAdd(e, splat(b, x, 1.0f))));
}

} // namespace rnnc::codegen

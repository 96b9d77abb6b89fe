// bf16 matrix products (--weights-dtype bf16, codegen/WeightType.h), the ProductKernelEmitter's
// part for them. A product with bf16 weights multiplies bf16 inputs: each row of x is rounded
// to bf16 (to nearest even) as it is copied for the tiles, and the products of the two are
// summed in fp32, on every CPU (so a CPU without AVX512_BF16 gives the same results up to the
// order of the sums, as for fp32):
//   - with AVX512_BF16 (PackedProduct::depthPairs), the weights of two consecutive depths are
//     packed in one 32-bit element and the row's copy is bf16; one vdpbf16ps multiplies 16
//     columns by a broadcast pair of inputs, 32 products where an FMA does 16;
//   - elsewhere the weights are widened to fp32 in registers and the rounded row stays fp32.
#include "codegen/ProductKernelEmitter.h"

#include "ir/Error.h"

#include <llvm/IR/IntrinsicsX86.h>

#include <algorithm>

namespace rnnc::codegen {
namespace {

constexpr int64_t kPairLanes = 16; // fp32 sums of one vdpbf16ps on zmm

} // namespace

llvm::Value* ProductKernelEmitter::bf16Bits(llvm::Value* v) {
  llvm::Type* i32 = v->getType()->getWithNewType(e.b.getInt32Ty());
  llvm::Type* i16 = v->getType()->getWithNewType(e.b.getInt16Ty());
  // The upper half of the fp32 bits, rounded to nearest even: add 0x7fff plus the lowest kept
  // bit, then shift. A NaN stays a (quiet) NaN rather than rounding into infinity.
  llvm::Value* bits = e.b.CreateBitCast(v, i32);
  llvm::Value* upper = e.b.CreateLShr(bits, 16);
  llvm::Value* lowestKept = e.b.CreateAnd(upper, 1);
  llvm::Value* rounded = e.b.CreateLShr(
      e.b.CreateAdd(bits, e.b.CreateAdd(lowestKept, llvm::ConstantInt::get(i32, 0x7fff))), 16);
  llvm::Value* nan = e.b.CreateFCmpUNO(v, v);
  llvm::Value* quietNaN = e.b.CreateOr(upper, 0x40);
  return e.b.CreateTrunc(e.b.CreateSelect(nan, quietNaN, rounded), i16);
}

void ProductKernelEmitter::bf16Rows(const View& to, const View& from, RowRange rows, int64_t depth,
                                    bool pairs, int64_t values) {
  e.synced = false;
  const int64_t width = e.target.vectorWidth, vectorDepth = depth / width * width;
  auto* floats = llvm::FixedVectorType::get(e.f32, static_cast<unsigned>(width));
  e.forLoop(rows.begin, rows.end, e.constant(1), "bf16row", [&](llvm::Value* r) {
    llvm::Value* source = e.elementPointer(from, r, e.constant(0));
    llvm::Value* row = e.elementPointer(to, r, e.constant(0));
    // Values [k, k + lanes) (a vector, or one value), rounded and stored.
    auto put = [&](llvm::Value* k, unsigned lanes) {
      llvm::Type* type = lanes == 1 ? e.f32 : static_cast<llvm::Type*>(floats);
      llvm::Value* v = e.b.CreateAlignedLoad(type, e.b.CreateGEP(e.f32, source, k), llvm::Align(4));
      llvm::Value* bits = bf16Bits(v);
      if (pairs) {
        e.b.CreateAlignedStore(bits, e.b.CreateGEP(e.b.getInt16Ty(), row, k), llvm::Align(2));
        return;
      }
      e.b.CreateAlignedStore(widenWeights(bits, WeightType::BF16), e.b.CreateGEP(e.f32, row, k),
                             llvm::Align(4));
    };
    e.forLoop(e.constant(0), e.constant(vectorDepth), e.constant(width), "bf16vec",
              [&](llvm::Value* k) { put(k, static_cast<unsigned>(width)); });
    e.forLoop(e.constant(vectorDepth), e.constant(depth), e.constant(1), "bf16one",
              [&](llvm::Value* k) { put(k, 1); });
    if (pairs && values > depth) // zero inputs where the weights are zero too (no NaN * 0)
      e.b.CreateMemSet(e.b.CreateConstGEP1_64(e.b.getInt16Ty(), row, depth), e.b.getInt8(0),
                       static_cast<uint64_t>(2 * (values - depth)), llvm::MaybeAlign(2));
  });
}

ProductKernelEmitter::Tile ProductKernelEmitter::emitBf16PairTile(const View& x, llvm::Value* words,
                                                                  const PackedProduct& packed,
                                                                  llvm::Value* blk,
                                                                  llvm::Value* firstRow,
                                                                  int64_t rows) {
  const int64_t slices = packed.slices(), pairs = packed.packedDepth();
  const int64_t parts = packed.width / kPairLanes; // vdpbf16ps per slice and row
  RNNC_INTERNAL_CHECK(parts * kPairLanes == packed.width, "bf16 pair blocks of 16 columns");
  const int64_t perPass = slicesPerPass(packed, rows, /*spare=*/1);
  llvm::Type* i32 = e.b.getInt32Ty();
  auto* lanes = llvm::FixedVectorType::get(e.f32, kPairLanes);
  auto* floats = llvm::FixedVectorType::get(e.f32, static_cast<unsigned>(packed.width));
  llvm::Function* dot =
      llvm::Intrinsic::getDeclaration(e.module.get(), llvm::Intrinsic::x86_avx512bf16_dpbf16ps_512);
  llvm::FunctionType* dotType = dot->getFunctionType();

  // The rows' bf16 copies, a pair per 32-bit word.
  const EmitContext::TileRows rowWords(e, x, firstRow, rows);
  llvm::Value* block =
      e.b.CreateGEP(i32, words, e.b.CreateMul(blk, e.constant(pairs * slices * packed.width)));

  Tile sums(static_cast<size_t>(rows), std::vector<llvm::Value*>(static_cast<size_t>(slices)));
  for (int64_t first = 0; first < slices; first += perPass) {
    const int64_t count = std::min(perPass, slices - first);
    std::vector<llvm::Value*> sliceWords;
    for (int64_t s = first; s < first + count; ++s)
      sliceWords.push_back(e.b.CreateConstGEP1_64(i32, block, packed.sliceStart(s)));
    const int64_t chains = accumulatorSets(packed, rows, count, /*spare=*/1, pairs);
    // Accumulator [(row * count + slice) * parts + part] of a set.
    auto slot = [&](int64_t m, int64_t s, int64_t part) {
      return static_cast<size_t>((m * count + s) * parts + part);
    };
    auto step = [&](llvm::Value* p, Accumulators& acc) {
      const std::vector<std::vector<llvm::Value*>> w = loadWeightParts(
          packed, sliceWords, first, p, parts, kPairLanes, dotType->getParamType(2));
      for (int64_t m = 0; m < rows; ++m) {
        llvm::Value* pair = e.b.CreateAlignedLoad(i32, rowWords.at(m, i32, p), llvm::Align(4));
        llvm::Value* input =
            e.b.CreateBitCast(e.b.CreateVectorSplat(kPairLanes, pair), dotType->getParamType(1));
        for (int64_t s = 0; s < count; ++s)
          for (int64_t part = 0; part < parts; ++part) {
            llvm::Value*& a = acc[slot(m, s, part)];
            a = e.b.CreateCall(dot, {a, input, w[s][part]});
          }
      }
    };
    const std::vector<Accumulators> acc =
        accumulateOverDepth(chains, pairs, static_cast<size_t>(rows * count * parts),
                            llvm::ConstantFP::get(lanes, 0.0), step, "pairdepth");

    // The sets added, the parts joined into the block's width.
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t s = 0; s < count; ++s) {
        llvm::Value* joined = sumOfSets(acc, slot(m, s, 0), parts);
        RNNC_INTERNAL_CHECK(joined->getType() == floats, "bf16 tile width");
        sums[m][first + s] = joined;
      }
  }
  return sums;
}

} // namespace rnnc::codegen

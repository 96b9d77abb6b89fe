// int8 matrix products (--weights-dtype int8, codegen/WeightType.h), the ProductKernelEmitter's
// part for them: dynamic quantization as PyTorch's quantize_dynamic does it, in the same tiles.
//   - Weights, when packed (by the runtime, runtime/exec/WeightPacking.h): each output column (a
//     row of W) symmetric, scale = max|w| / 127,
//     q = round(w / scale) in [-127, 127]; per block and slice, the columns' scales and the
//     sums of their q (for the zero point below) beside the packed bytes.
//   - Inputs, as each row is copied for the tiles (per step for the recurrent product): 7-bit
//     unsigned, scale = (max - min) / 127 over the row with 0 in the range, zero point
//     z = round(-min / scale), q = round(x * (1 / scale)) + z in [0, 127]. Seven bits, because
//     vpmaddubsw adds two u8 x s8 products in 16 bits with saturation: 2 * 127 * 127 fits, 2 *
//     255 * 127 does not (PyTorch's x86 kernels reduce the range the same way).
//   - Tiles: 4 depths at a time, the row's 4 bytes broadcast against each column's 4 weights:
//     vpmaddubsw (u8 x s8 -> pairs summed in i16), vpmaddwd with ones (-> i32), added to i32
//     accumulators; with AVX-VNNI or AVX512-VNNI one vpdpbusd does all three (the same sums:
//     the inputs keep 7 bits there too, so that every CPU gives the same results). Then
//     sum * x_scale * w_scale - z * x_scale * w_scale * colsum(q), in fp32.
// A row or column with a NaN or an infinity has a NaN scale, so its results are NaN rather
// than quietly wrong.
#include "codegen/ProductKernelEmitter.h"

#include "ir/Error.h"

#include <llvm/IR/IntrinsicsX86.h>

#include <algorithm>

namespace rnnc::codegen {
namespace {

constexpr float kInputLevels = 127; // 7-bit inputs

} // namespace

llvm::Value* ProductKernelEmitter::entrySlot(llvm::Type* type, const char* name) {
  llvm::IRBuilder<> entry(&e.fn->getEntryBlock(), e.fn->getEntryBlock().begin());
  return entry.CreateAlloca(type, nullptr, name);
}

llvm::Value* ProductKernelEmitter::roundToInt(llvm::Value* v, float lowest, float highest) {
  return clampToInt(e.b.CreateUnaryIntrinsic(llvm::Intrinsic::roundeven, v), lowest, highest);
}

llvm::Value* ProductKernelEmitter::clampToInt(llvm::Value* v, float lowest, float highest) {
  llvm::Type* type = v->getType();
  llvm::Type* ints = e.b.getInt32Ty();
  if (auto* vector = llvm::dyn_cast<llvm::FixedVectorType>(type))
    ints = llvm::FixedVectorType::get(ints, vector->getNumElements());
  // Compare-and-select clamps, each one vmaxps or vminps: the bound, not v, is what the
  // compare keeps when v is NaN, so a NaN comes out as `lowest` (fptosi of NaN is poison).
  llvm::Value* low = llvm::ConstantFP::get(type, lowest);
  llvm::Value* high = llvm::ConstantFP::get(type, highest);
  v = e.b.CreateSelect(e.b.CreateFCmpOGT(v, low), v, low);
  v = e.b.CreateSelect(e.b.CreateFCmpOLT(v, high), v, high);
  return e.b.CreateFPToSI(v, ints);
}

void ProductKernelEmitter::quantizeRows(const View& to, const View& from, RowRange rows,
                                        int64_t depth, int64_t stride) {
  e.synced = false;
  // Vectors of the target's width over the row, then the last few elements one by one.
  const int64_t width = e.target.vectorWidth, vectorDepth = depth / width * width;
  auto* floats = llvm::FixedVectorType::get(e.f32, static_cast<unsigned>(width));
  llvm::Value* low = entrySlot(floats, "qlow");
  llvm::Value* high = entrySlot(floats, "qhigh");
  llvm::Value* probe = entrySlot(floats, "qprobe");
  llvm::Value* lowOne = entrySlot(e.f32, "qlow1");
  llvm::Value* highOne = entrySlot(e.f32, "qhigh1");
  llvm::Value* probeOne = entrySlot(e.f32, "qprobe1");
  llvm::Type* i8 = e.b.getInt8Ty();
  e.forLoop(rows.begin, rows.end, e.constant(1), "quantize", [&](llvm::Value* r) {
    llvm::Value* source = e.elementPointer(from, r, e.constant(0));
    llvm::Value* bytes = e.elementPointer(to, r, e.constant(0));
    auto load = [&](llvm::Type* type, llvm::Value* k) {
      return e.b.CreateAlignedLoad(type, e.b.CreateGEP(e.f32, source, k), llvm::Align(4));
    };
    // The range, with 0 in it (so that 0 is exact: zero padding, ReLU's zeros), by
    // compare-and-select (one vminps or vmaxps each, where NaN-propagating minimum and maximum
    // were a dozen instructions a vector: the row's quantization was 6% of an int8 LSTM's
    // time); NaN and infinities show in the probe, the sum of x * 0 (NaN for those, else 0).
    auto update = [&](llvm::Value* lowSlot, llvm::Value* highSlot, llvm::Value* probeSlot,
                      llvm::Type* type, llvm::Value* v) {
      llvm::Value* lo = e.b.CreateLoad(type, lowSlot);
      llvm::Value* hi = e.b.CreateLoad(type, highSlot);
      e.b.CreateStore(e.b.CreateSelect(e.b.CreateFCmpOLT(v, lo), v, lo), lowSlot);
      e.b.CreateStore(e.b.CreateSelect(e.b.CreateFCmpOGT(v, hi), v, hi), highSlot);
      e.b.CreateStore(e.b.CreateIntrinsic(
                          llvm::Intrinsic::fmuladd, {type},
                          {v, llvm::ConstantFP::get(type, 0.0), e.b.CreateLoad(type, probeSlot)}),
                      probeSlot);
    };
    for (llvm::Value* slot : {low, high, probe})
      e.b.CreateStore(llvm::ConstantFP::get(floats, 0.0), slot);
    for (llvm::Value* slot : {lowOne, highOne, probeOne})
      e.b.CreateStore(llvm::ConstantFP::get(e.f32, 0.0), slot);
    e.forLoop(e.constant(0), e.constant(vectorDepth), e.constant(width), "qrange",
              [&](llvm::Value* k) { update(low, high, probe, floats, load(floats, k)); });
    e.forLoop(e.constant(vectorDepth), e.constant(depth), e.constant(1), "qrange1",
              [&](llvm::Value* k) { update(lowOne, highOne, probeOne, e.f32, load(e.f32, k)); });
    // The lanes joined (NaN-free by now, so the plain reductions do), then the probe added.
    llvm::FastMathFlags noNaN;
    noNaN.setNoNaNs();
    auto reduced = [&](llvm::Value* lanes, bool highest) {
      llvm::Value* r = highest ? e.b.CreateFPMaxReduce(lanes) : e.b.CreateFPMinReduce(lanes);
      llvm::cast<llvm::Instruction>(r)->setFastMathFlags(noNaN);
      return r;
    };
    llvm::Value* lowest = reduced(e.b.CreateLoad(floats, low), false);
    lowest = e.b.CreateSelect(e.b.CreateFCmpOLT(e.b.CreateLoad(e.f32, lowOne), lowest),
                              e.b.CreateLoad(e.f32, lowOne), lowest);
    llvm::Value* highest = reduced(e.b.CreateLoad(floats, high), true);
    highest = e.b.CreateSelect(e.b.CreateFCmpOGT(e.b.CreateLoad(e.f32, highOne), highest),
                               e.b.CreateLoad(e.f32, highOne), highest);
    llvm::Value* probeSum =
        e.b.CreateFAddReduce(e.b.CreateLoad(e.f32, probeOne), e.b.CreateLoad(floats, probe));
    llvm::FastMathFlags anyOrder; // a sum of zeros and NaNs: any order gives the same
    anyOrder.setAllowReassoc();
    llvm::cast<llvm::Instruction>(probeSum)->setFastMathFlags(anyOrder);
    llvm::Value* range = e.b.CreateFSub(highest, lowest);
    llvm::Value* probed = e.b.CreateFAdd(probeSum, range);
    llvm::Value* finite = e.b.CreateFCmpOLT(probed, llvm::ConstantFP::getInfinity(e.f32));
    llvm::Value* scale = e.b.CreateFDiv(range, llvm::ConstantFP::get(e.f32, kInputLevels));
    scale = e.b.CreateSelect(e.b.CreateFCmpOEQ(scale, llvm::ConstantFP::get(e.f32, 0.0)),
                             llvm::ConstantFP::get(e.f32, 1.0), scale);
    scale = e.b.CreateSelect(finite, scale, llvm::ConstantFP::get(e.f32, 1.0));
    // A row that is not finite quantizes to zeros: its inverse scale and zero point are 0, and
    // its NaN products (x * 0) clamp to 0.
    llvm::Value* inverse =
        e.b.CreateSelect(finite, e.b.CreateFDiv(llvm::ConstantFP::get(e.f32, 1.0), scale),
                         llvm::ConstantFP::get(e.f32, 0.0));
    llvm::Value* zero = roundToInt(e.b.CreateFDiv(e.b.CreateFNeg(lowest), scale), 0, kInputLevels);
    zero = e.b.CreateSelect(finite, zero, e.b.getInt32(0));
    llvm::Value* zeroFloat = e.b.CreateSIToFP(zero, e.f32);
    // q = round(x / scale) + zero, clamped to [0, 127] (exact in floats: |x / scale| <= 127).
    auto quantize = [&](llvm::Value* v, unsigned lanes) {
      auto splat = [&](llvm::Value* scalar) {
        return lanes == 1 ? scalar : e.b.CreateVectorSplat(lanes, scalar);
      };
      llvm::Value* rounded =
          e.b.CreateUnaryIntrinsic(llvm::Intrinsic::roundeven, e.b.CreateFMul(v, splat(inverse)));
      llvm::Value* q = clampToInt(e.b.CreateFAdd(rounded, splat(zeroFloat)), 0, kInputLevels);
      llvm::Type* narrow = lanes == 1 ? i8 : llvm::FixedVectorType::get(i8, lanes);
      return e.b.CreateTrunc(q, narrow);
    };
    e.forLoop(e.constant(0), e.constant(vectorDepth), e.constant(width), "qrow",
              [&](llvm::Value* k) {
                e.b.CreateAlignedStore(quantize(load(floats, k), static_cast<unsigned>(width)),
                                       e.b.CreateGEP(i8, bytes, k), llvm::Align(1));
              });
    e.forLoop(e.constant(vectorDepth), e.constant(depth), e.constant(1), "qrow1",
              [&](llvm::Value* k) {
                e.b.CreateStore(quantize(load(e.f32, k), 1), e.b.CreateGEP(i8, bytes, k));
              });
    // The row's scale and zero point in its last two floats.
    e.b.CreateAlignedStore(e.b.CreateSelect(finite, scale, llvm::ConstantFP::getNaN(e.f32)),
                           e.b.CreateConstGEP1_64(e.f32, bytes, stride - 2), llvm::Align(4));
    e.b.CreateAlignedStore(zeroFloat, e.b.CreateConstGEP1_64(e.f32, bytes, stride - 1),
                           llvm::Align(4));
  });
}

ProductKernelEmitter::Tile ProductKernelEmitter::emitInt8Tile(const View& x, llvm::Value* words,
                                                              const PackedProduct& packed,
                                                              llvm::Value* blk,
                                                              llvm::Value* firstRow, int64_t rows) {
  const int64_t slices = packed.slices(), groups = packed.packedDepth();
  // i32 lanes of one multiply: vpdpbusd on zmm with AVX512-VNNI and 16-float vectors (half the
  // instructions of two on ymm: int8 went from 1.4x to 3.2x the fp32 speed on Zen 5), else ymm
  // (vpdpbusd of AVX-VNNI / AVX512-VNNI+VL, or vpmaddubsw + vpmaddwd).
  const bool vnni512 = e.target.has("avx512vnni") && e.target.vectorWidth == 16;
  const int64_t kLanesPerMultiply = vnni512 ? 16 : 8;
  const int64_t parts = packed.width / kLanesPerMultiply; // multiplies per slice and row
  RNNC_INTERNAL_CHECK(parts * kLanesPerMultiply == packed.width, "int8 blocks of whole multiplies");
  // As for fp32 (emitTile), with three registers for the broadcast, the ones and a product.
  constexpr int64_t kSpare = 3;
  const int64_t perPass = slicesPerPass(packed, rows, kSpare);

  llvm::Type* i32 = e.b.getInt32Ty();
  llvm::Type* i8 = e.b.getInt8Ty();
  auto* lanes = llvm::FixedVectorType::get(i32, kLanesPerMultiply);
  auto* bytes = llvm::FixedVectorType::get(i8, kLanesPerMultiply * 4);
  auto* pairs = llvm::FixedVectorType::get(e.b.getInt16Ty(), kLanesPerMultiply * 2);
  llvm::Value* ones = llvm::ConstantInt::get(pairs, 1);
  const bool vnni = vnni512 || e.target.has("avxvnni") ||
                    (e.target.has("avx512vnni") && e.target.has("avx512vl"));

  const EmitContext::TileRows rowBytes(e, x, firstRow, rows);
  llvm::Value* block =
      e.b.CreateGEP(i32, words, e.b.CreateMul(blk, e.constant(groups * slices * packed.width)));

  Tile sums(static_cast<size_t>(rows), std::vector<llvm::Value*>(static_cast<size_t>(slices)));
  for (int64_t first = 0; first < slices; first += perPass) {
    const int64_t count = std::min(perPass, slices - first);
    std::vector<llvm::Value*> sliceWords;
    for (int64_t s = first; s < first + count; ++s)
      sliceWords.push_back(e.b.CreateConstGEP1_64(i32, block, packed.sliceStart(s)));
    // Split the depth between accumulator sets where few rows leave few of them (emitTile).
    const int64_t chains = accumulatorSets(packed, rows, count, kSpare, groups);
    // Accumulator [(row * count + slice) * parts + part] of a set.
    auto slot = [&](int64_t m, int64_t s, int64_t p) {
      return static_cast<size_t>((m * count + s) * parts + p);
    };
    auto step = [&](llvm::Value* g, Accumulators& acc) {
      const std::vector<std::vector<llvm::Value*>> w =
          loadWeightParts(packed, sliceWords, first, g, parts, kLanesPerMultiply, bytes);
      for (int64_t m = 0; m < rows; ++m) {
        llvm::Value* four = e.b.CreateAlignedLoad(i32, rowBytes.at(m, i32, g), llvm::Align(1));
        llvm::Value* input =
            e.b.CreateBitCast(e.b.CreateVectorSplat(kLanesPerMultiply, four), bytes);
        for (int64_t s = 0; s < count; ++s)
          for (int64_t p = 0; p < parts; ++p) {
            llvm::Value*& a = acc[slot(m, s, p)];
            if (vnni) {
              a = e.b.CreateIntrinsic(
                  vnni512 ? llvm::Intrinsic::x86_avx512_vpdpbusd_512
                          : llvm::Intrinsic::x86_avx512_vpdpbusd_256,
                  {}, {a, e.b.CreateBitCast(input, lanes), e.b.CreateBitCast(w[s][p], lanes)});
              continue;
            }
            llvm::Value* products =
                e.b.CreateIntrinsic(llvm::Intrinsic::x86_avx2_pmadd_ub_sw, {}, {input, w[s][p]});
            llvm::Value* quads =
                e.b.CreateIntrinsic(llvm::Intrinsic::x86_avx2_pmadd_wd, {}, {products, ones});
            a = e.b.CreateAdd(a, quads);
          }
      }
    };
    const std::vector<Accumulators> acc =
        accumulateOverDepth(chains, groups, static_cast<size_t>(rows * count * parts),
                            llvm::ConstantInt::get(lanes, 0), step, "qdepth");

    // Dequantized where the sums are final: loading the rows' scales before the depth loop, the
    // tile's rows' pairs had no registers left there and went to the stack and back.
    const Int8Columns columns = int8Columns(packed, blk, first, count);
    for (int64_t m = 0; m < rows; ++m) {
      std::vector<llvm::Value*> rowSums;
      for (int64_t s = 0; s < count; ++s)
        rowSums.push_back(sumOfSets(acc, slot(m, s, 0), parts));
      const std::vector<llvm::Value*> row =
          dequantizedRow(packed, rowBytes.start(m), rowSums, columns);
      for (int64_t s = 0; s < count; ++s)
        sums[m][first + s] = row[static_cast<size_t>(s)];
    }
  }
  return sums;
}

ProductKernelEmitter::Int8Columns ProductKernelEmitter::int8Columns(const PackedProduct& packed,
                                                                    llvm::Value* blk, int64_t first,
                                                                    int64_t count) {
  auto* floats = llvm::FixedVectorType::get(e.f32, static_cast<unsigned>(packed.width));
  llvm::Value* blockScales =
      e.b.CreateGEP(e.f32, e.buffers[packed.scaleBuffer],
                    e.b.CreateMul(blk, e.constant(packed.slices() * packed.width * 2)));
  Int8Columns columns;
  for (int64_t s = first; s < first + count; ++s) {
    const int64_t at = s * 2 * packed.width;
    columns.weightScale.push_back(e.b.CreateAlignedLoad(
        floats, e.b.CreateConstGEP1_64(e.f32, blockScales, at), llvm::Align(4)));
    columns.columnSum.push_back(e.b.CreateAlignedLoad(
        floats, e.b.CreateConstGEP1_64(e.f32, blockScales, at + packed.width), llvm::Align(4)));
  }
  return columns;
}

std::vector<llvm::Value*>
ProductKernelEmitter::dequantizedRow(const PackedProduct& packed, llvm::Value* rowStart,
                                     const std::vector<llvm::Value*>& sums,
                                     const Int8Columns& columns) {
  auto* floats = llvm::FixedVectorType::get(e.f32, static_cast<unsigned>(packed.width));
  auto rowFactor = [&](int64_t k) { // the row's scale (0) or zero point (1)
    return e.b.CreateVectorSplat(
        static_cast<unsigned>(packed.width),
        e.b.CreateAlignedLoad(e.f32,
                              e.b.CreateConstGEP1_64(e.f32, rowStart, packed.xStride - 2 + k),
                              llvm::Align(4)));
  };
  llvm::Value* rowScale = rowFactor(0);
  llvm::Value* minusZero = e.b.CreateFNeg(rowFactor(1));
  // The correction is exact in floats (integers under 2^24), so one fused multiply-add gives it.
  std::vector<llvm::Value*> row;
  for (size_t s = 0; s < sums.size(); ++s) {
    llvm::Value* total = e.b.CreateSIToFP(sums[s], floats);
    llvm::Value* corrected = e.b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {floats},
                                                 {minusZero, columns.columnSum[s], total});
    row.push_back(e.b.CreateFMul(corrected, e.b.CreateFMul(rowScale, columns.weightScale[s])));
  }
  return row;
}

} // namespace rnnc::codegen

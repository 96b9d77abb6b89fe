// bf16 and int8 matrix products on AMX tiles (PackedProduct::amxTiles: --weights-dtype bf16 on
// a CPU with AMX-BF16, int8 with AMX-INT8: Intel's Sapphire Rapids and later), the
// ProductKernelEmitter's part for them. An A tile holds 16 rows of the rows' copies, 64 bytes
// of depth each; a B tile 16 words of depth of 16 columns of the packed weights, in the layout
// the vector tiles read (a panel's row per word); a C tile 16 x 16 sums:
//   - bf16: one tdpbf16ps multiplies 16 rows x 32 depths (bf16 pairs) x 16 columns into fp32
//     sums, 16 times an FMA's products. Where Intel's vdpbf16ps runs at half the FMAs' rate
//     (Target::pairsBf16Products), this is the fast bf16 path.
//   - int8: one tdpbusd multiplies 16 rows x 64 depths (the rows quantized to 7 bits as
//     codegen/QuantizedProducts.cpp does, the weights in its groups of 4) x 16 columns into the
//     same exact int32 sums as vpdpbusd's, dequantized the same way.
// Each weight tile multiplies up to two row tiles (a tile of 32 rows), so the registers hold
// 2 A tiles, 1 B and up to 5 C.
//
// The tiles are LLVM's AMX intrinsics on x86_amx values; the accumulators cross the depth loop
// as <256 x i32> vectors cast to and from tiles (as clang's __tile1024i does), which LLVM's AMX
// lowering keeps in tile registers, and it configures the tiles (ldtilecfg) in each function
// that uses them. The OS must have granted the process the tiles' state first
// (runtime/exec/AmxPermission.h).
#include "codegen/ProductKernelEmitter.h"

#include "ir/Error.h"

#include <llvm/IR/IntrinsicsX86.h>

#include <algorithm>
#include <sstream>

namespace rnnc::codegen {
namespace {

constexpr int64_t kTileBytes = 64;   // a tile row's bytes: 16 sums, or 16 words of depth
constexpr int64_t kTileColumns = 16; // sums per C tile row
constexpr int64_t kTileRegisters = 8;

} // namespace

// Rows [0, rows) of A at `rowsBase` (`rowStride` bytes apart) times the block's weights at
// `block`, into `sums` (row m's slices side by side). In passes of as many slices as the sum
// tiles left beside the A and B tiles hold; each pass one walk over the depth, a tile (16 words)
// a step.
void ProductKernelEmitter::emitAmxTileBody(const PackedProduct& packed, int64_t rows,
                                           llvm::Value* rowsBase, llvm::Value* rowStride,
                                           llvm::Value* block, llvm::Value* sums) {
  const int64_t slices = packed.slices(), words = packed.packedDepth();
  const int64_t parts = packed.width / kTileColumns; // C tiles per slice
  llvm::Type* i8 = e.b.getInt8Ty();
  llvm::Type* i32 = e.b.getInt32Ty();
  auto* sumVector = llvm::FixedVectorType::get(i32, 256); // a tile as LLVM's casts see it
  llvm::Module* module = e.module.get();
  using llvm::Intrinsic::getDeclaration;
  llvm::Function* load = getDeclaration(module, llvm::Intrinsic::x86_tileloadd64_internal);
  // bf16 pairs into fp32 sums; int8 groups of 4 (unsigned 7-bit inputs, signed weights) into
  // int32 sums, exact: the same as vpdpbusd's (codegen/QuantizedProducts.cpp).
  llvm::Function* dot = getDeclaration(module, packed.weights == WeightType::I8
                                                   ? llvm::Intrinsic::x86_tdpbusd_internal
                                                   : llvm::Intrinsic::x86_tdpbf16ps_internal);
  llvm::Function* zero = getDeclaration(module, llvm::Intrinsic::x86_tilezero_internal);
  llvm::Function* store = getDeclaration(module, llvm::Intrinsic::x86_tilestored64_internal);
  llvm::Function* toVector =
      getDeclaration(module, llvm::Intrinsic::x86_cast_tile_to_vector, {sumVector});
  llvm::Function* toTile =
      getDeclaration(module, llvm::Intrinsic::x86_cast_vector_to_tile, {sumVector});
  llvm::Value* rowBytes = e.b.getInt16(kTileBytes);
  llvm::Value* wordRows = e.b.getInt16(kAmxTileWords);
  // Rows in A tiles of 16 (the last shorter), each weight tile multiplied with all of them: the
  // tile registers hold the A tiles, one weight tile (B) and the pass's sums (C).
  const int64_t rowTiles = (rows + kAmxTileRows - 1) / kAmxTileRows;
  auto rowsOf = [&](int64_t t) { return std::min(kAmxTileRows, rows - t * kAmxTileRows); };
  const int64_t sumTiles = kTileRegisters - rowTiles - 1;
  RNNC_INTERNAL_CHECK(parts * rowTiles <= sumTiles, "AMX sums past the tile registers");
  const int64_t perPass = std::max<int64_t>(1, std::min(slices, sumTiles / (parts * rowTiles)));
  for (int64_t first = 0; first < slices; first += perPass) {
    const int64_t count = std::min(perPass, slices - first);
    // The depth loop, its accumulators phis of their own zero tiles (AMX has no tile move).
    // Accumulator (t * count + s) * parts + part: row tile t, slice first + s, its part.
    const size_t accumulators = static_cast<size_t>(rowTiles * count * parts);
    auto slot = [&](int64_t t, int64_t s, int64_t part) {
      return static_cast<size_t>((t * count + s) * parts + part);
    };
    llvm::BasicBlock* before = e.b.GetInsertBlock();
    Accumulators zeros(accumulators);
    for (int64_t t = 0; t < rowTiles; ++t)
      for (int64_t i = 0; i < count * parts; ++i)
        zeros[slot(t, 0, 0) + static_cast<size_t>(i)] = e.b.CreateCall(
            toVector,
            {e.b.CreateCall(zero, {e.b.getInt16(static_cast<uint16_t>(rowsOf(t))), rowBytes})});
    auto [group, header, exit] = e.openLoop(e.constant(0), "amxdepth");
    Accumulators acc;
    std::vector<llvm::PHINode*> phis;
    for (size_t i = 0; i < accumulators; ++i) {
      phis.push_back(e.b.CreatePHI(sumVector, 2));
      phis.back()->addIncoming(zeros[i], before);
      acc.push_back(phis.back());
    }
    llvm::Value* word = e.b.CreateMul(group, e.constant(kAmxTileWords));
    std::vector<llvm::Value*> a;
    for (int64_t t = 0; t < rowTiles; ++t)
      a.push_back(e.b.CreateCall(
          load,
          {e.b.getInt16(static_cast<uint16_t>(rowsOf(t))), rowBytes,
           e.b.CreateGEP(i8, rowsBase,
                         e.b.CreateAdd(e.b.CreateMul(word, e.constant(4)),
                                       e.b.CreateMul(rowStride, e.constant(t * kAmxTileRows)))),
           rowStride}));
    for (int64_t s = 0; s < count; ++s) {
      const int64_t panelWidth = packed.panelWidth(first + s);
      llvm::Value* sliceWords = e.b.CreateConstGEP1_64(i32, block, packed.sliceStart(first + s));
      for (int64_t part = 0; part < parts; ++part) {
        llvm::Value* at = e.b.CreateAdd(e.b.CreateMul(word, e.constant(panelWidth)),
                                        e.constant(part * kTileColumns));
        llvm::Value* b =
            e.b.CreateCall(load, {wordRows, rowBytes, e.b.CreateGEP(i32, sliceWords, at),
                                  e.constant(panelWidth * 4)});
        for (int64_t t = 0; t < rowTiles; ++t) {
          llvm::Value*& sum = acc[slot(t, s, part)];
          sum = e.b.CreateCall(
              toVector,
              {e.b.CreateCall(dot, {e.b.getInt16(static_cast<uint16_t>(rowsOf(t))), rowBytes,
                                    rowBytes, e.b.CreateCall(toTile, {sum}), a[t], b})});
        }
      }
    }
    llvm::Value* next = e.b.CreateAdd(group, e.constant(1));
    llvm::BasicBlock* latch = e.b.GetInsertBlock();
    for (size_t i = 0; i < accumulators; ++i)
      phis[i]->addIncoming(acc[i], latch);
    group->addIncoming(next, latch);
    e.b.CreateCondBr(e.b.CreateICmpSLT(next, e.constant(words / kAmxTileWords)), header, exit);
    e.b.SetInsertPoint(exit);
    // C tile (t, s, part) to rows [16 t, 16 t + 16)'s slice s, columns [16 part, 16 part + 16).
    const int64_t sumStride = slices * packed.width; // floats from one row's sums to the next
    for (int64_t t = 0; t < rowTiles; ++t)
      for (int64_t s = 0; s < count; ++s)
        for (int64_t part = 0; part < parts; ++part)
          e.b.CreateCall(
              store, {e.b.getInt16(static_cast<uint16_t>(rowsOf(t))), rowBytes,
                      e.b.CreateConstGEP1_64(e.f32, sums,
                                             t * kAmxTileRows * sumStride +
                                                 (first + s) * packed.width + part * kTileColumns),
                      e.constant(sumStride * 4), e.b.CreateCall(toTile, {acc[slot(t, s, part)]})});
  }
}

ProductKernelEmitter::Tile ProductKernelEmitter::emitAmxTile(const View& x, llvm::Value* words,
                                                             const PackedProduct& packed,
                                                             llvm::Value* blk,
                                                             llvm::Value* firstRow, int64_t rows) {
  const int64_t slices = packed.slices(), depthWords = packed.packedDepth();
  const int64_t parts = packed.width / kTileColumns; // C tiles per slice
  RNNC_INTERNAL_CHECK(parts * kTileColumns == packed.width, "AMX blocks of whole tiles");
  RNNC_INTERNAL_CHECK(depthWords % kAmxTileWords == 0, "AMX depth padded to whole tiles");
  RNNC_INTERNAL_CHECK(rows >= 1 && rows <= 2 * kAmxTileRows, "AMX tiles of 1 to 32 rows");
  llvm::Type* i32 = e.b.getInt32Ty();
  auto* floats = llvm::FixedVectorType::get(e.f32, static_cast<unsigned>(packed.width));
  llvm::Module* module = e.module.get();
  // A: the rows' copies (PackedProduct::xBuffer): bf16, zero past the product's depth; or int8,
  // quantized (what follows the depth is multiplied by zero weights).
  llvm::Value* rowsBase = e.elementPointer(x, firstRow, e.constant(0));
  llvm::Value* rowStride = e.b.CreateMul(x.rowStride, e.constant(sizeof(float)));
  llvm::Value* block =
      e.b.CreateGEP(i32, words, e.b.CreateMul(blk, e.constant(depthWords * slices * packed.width)));
  // The sums, as the epilogue reads them: row m's slices side by side (`width` floats each).
  llvm::IRBuilder<> entry(&e.fn->getEntryBlock(), e.fn->getEntryBlock().begin());
  llvm::AllocaInst* sums =
      entry.CreateAlloca(e.f32, e.constant(rows * slices * packed.width), "amx_sums");
  sums->setAlignment(llvm::Align(64));

  // The tiles' work is a function of its own, one per shape: in the run function, with its
  // many tile heights, LLVM's allocation of the 8 tile registers ran out of them.
  std::ostringstream name;
  name << "rnnc_amx." << weightTypeName(packed.weights) << "." << rows << "r." << depthWords << "k."
       << packed.width << "w";
  for (int64_t s = 0; s < slices; ++s)
    name << "." << packed.sliceStart(s) << "_" << packed.panelWidth(s);
  llvm::Function* tiles = module->getFunction(name.str());
  if (!tiles) {
    auto* type = llvm::FunctionType::get(e.b.getVoidTy(), {e.ptr, e.i64, e.ptr, e.ptr}, false);
    tiles = llvm::Function::Create(type, llvm::Function::InternalLinkage, name.str(), module);
    for (const char* attribute : {"target-cpu", "target-features"})
      tiles->addFnAttr(e.fn->getFnAttribute(attribute));
    tiles->addFnAttr(llvm::Attribute::NoUnwind);
    tiles->addFnAttr(llvm::Attribute::NoInline);
    const llvm::IRBuilderBase::InsertPoint caller = e.b.saveIP();
    llvm::Function* callerFn = e.fn;
    e.fn = tiles;
    e.b.SetInsertPoint(llvm::BasicBlock::Create(e.llvmContext, "entry", tiles));
    emitAmxTileBody(packed, rows, tiles->getArg(0), tiles->getArg(1), tiles->getArg(2),
                    tiles->getArg(3));
    e.b.CreateRetVoid();
    e.fn = callerFn;
    e.b.restoreIP(caller);
  }
  e.b.CreateCall(tiles, {rowsBase, rowStride, block, sums});

  Tile tile(static_cast<size_t>(rows), std::vector<llvm::Value*>(static_cast<size_t>(slices)));
  auto sumsAt = [&](int64_t m, int64_t s, llvm::Type* type) {
    return e.b.CreateAlignedLoad(
        type, e.b.CreateConstGEP1_64(e.f32, sums, (m * slices + s) * packed.width),
        llvm::Align(64));
  };
  if (packed.weights != WeightType::I8) {
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t s = 0; s < slices; ++s)
        tile[m][s] = sumsAt(m, s, floats);
    return tile;
  }
  // int8: dequantized as emitInt8Tile's sums are.
  auto* ints = llvm::FixedVectorType::get(i32, static_cast<unsigned>(packed.width));
  const Int8Columns columns = int8Columns(packed, blk, 0, slices);
  for (int64_t m = 0; m < rows; ++m) {
    std::vector<llvm::Value*> rowSums;
    for (int64_t s = 0; s < slices; ++s)
      rowSums.push_back(sumsAt(m, s, ints));
    tile[static_cast<size_t>(m)] = dequantizedRow(
        packed, e.elementPointer(x, e.b.CreateAdd(firstRow, e.constant(m)), e.constant(0)), rowSums,
        columns);
  }
  return tile;
}

} // namespace rnnc::codegen

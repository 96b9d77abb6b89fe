// The GPU lowering's emitter (codegen/GpuEmitter.h says what it emits), shared by its two files:
//   - GpuEmitter.cpp: the regions, their items, a product's item on a warp (its depth split
//     between the lanes), the packing, the elementwise instructions, the copies that end a step,
//     and the entry points (the kernels and the persistent one's grid barrier for a GPU, the
//     emulation for the host);
//   - GpuBlockTile.cpp: a product's item on a block of threads staging chunks in shared memory.
// Two files rather than one per part: each that includes LLVM's IR headers costs 3 s of build.
// Internal to codegen/.
#pragma once

#include "codegen/EmitContext.h"
#include "codegen/GpuPlan.h"
#include "codegen/KernelEmitter.h"

#include <memory>
#include <vector>

namespace rnnc::codegen {

class GpuEmitter : public EmitContext {
public:
  GpuEmitter(llvm::LLVMContext& llvmContext, const ir::Cell& cell, const StoragePlan& plan,
             const std::vector<GpuRegion>& regions, const Target& target)
      : EmitContext(llvmContext, cell, plan, target, "rnnc_unused"), regions_(regions),
        kernels_(*this) {
    denseInputs = true; // GpuCell's inputs are whole tensors, on the device or emulated
  }

  std::unique_ptr<llvm::Module> emit();

private:
  llvm::Function* emitRegion(size_t index);
  // The region's work on one item (its grid-stride loop's body).
  void emitItem(const GpuRegion& region, llvm::Value* item, llvm::Value* rows);
  void emitSplitDepthProduct(const GpuRegion& region, llvm::Value* item, llvm::Value* rows);
  // One block tile (PackedProduct::blockTiled) as thread blockThread_ of its block on a GPU, or
  // (emulated) as every thread of the block in turn between the barriers.
  void emitBlockTile(const GpuRegion& region, llvm::Value* item, llvm::Value* rows);
  // The shared memory a block tile stages its chunks in: the module's (address space 3) on a
  // GPU, the emulated block's own stack on the host.
  llvm::Value* sharedMemory(int64_t floats);
  // What a split-depth product starts an item with: which values of the kernel are which slice's
  // sums, views of what else it reads, the item's row tile and column, its rows clamped to the last
  // (rows past it are read as the last and not stored: no branch in the depth loop), and its
  // sums, zero.
  struct ProductTile {
    std::vector<std::vector<const ir::Value*>> sliceValues;
    View x, result; // result: a standalone product's own buffer
    llvm::Value* firstRow = nullptr;
    llvm::Value* j = nullptr;
    std::vector<llvm::Value*> rows;
    std::vector<llvm::AllocaInst*> sums; // [row * slices + slice]
  };
  ProductTile startProduct(const GpuRegion& region, llvm::Value* item, llvm::Value* rows);
  // Element (r, j), given its sum for each slice: the kernel's elementwise work (a standalone
  // product: the sum stored).
  void finishElement(const GpuRegion& region, const ProductTile& tile, llvm::Value* r,
                     llvm::Value* j, const std::vector<llvm::Value*>& sliceSums);
  // Which values of the kernel are which slice's sums and views of what else the product and
  // its kernel read (ProductTile's first three members).
  void productViews(const GpuRegion& region, ProductTile& tile);
  // The sum of `value` over the warp's lanes, in every lane (shuffles, butterfly order).
  llvm::Value* warpSum(llvm::Value* value);
  void emitPacking(const PackedProduct& packed, llvm::Value* item);
  void emitInstruction(const ir::Instr& instr, llvm::Value* item);
  void emitStepEnd(const GpuRegion& region, llvm::Value* item);

  // The entry points: kernels for a GPU, the emulation for the host.
  void emitKernels(const std::vector<llvm::Function*>& regionFunctions);
  void emitEmulation(const std::vector<llvm::Function*>& regionFunctions);
  void gridBarrier(llvm::Value* counter, llvm::Value* generation);
  void hostBarrier(llvm::Value* counter, llvm::Value* generation, llvm::Value* blocks);
  void emitPersistentSteps(const std::vector<llvm::Function*>& regionFunctions, llvm::Value* args,
                           llvm::Value* counter, llvm::Value* me, llvm::Value* all);
  llvm::Value* specialRegister(llvm::Intrinsic::ID id);
  // The tensors and buffers are all in the GPU's global memory: said so (a cast to the global
  // address space and back, which LLVM's address space inference turns into ld.global and
  // st.global instead of generic loads and stores that check the address's space each time).
  void markGlobal() {
    llvm::Type* global = llvm::PointerType::get(llvmContext, 1);
    auto mark = [&](llvm::Value*& p) {
      p = b.CreateAddrSpaceCast(b.CreateAddrSpaceCast(p, global), ptr);
    };
    for (auto* list : {&params, &inputs, &states, &buffers})
      for (llvm::Value*& p : *list)
        mark(p);
    mark(output);
  }

  llvm::Value* load(const View& v, llvm::Value* r, llvm::Value* c) {
    return b.CreateAlignedLoad(f32, elementPointer(v, r, c), llvm::Align(4));
  }
  void store(llvm::Value* value, const View& v, llvm::Value* r, llvm::Value* c) {
    b.CreateAlignedStore(value, elementPointer(v, r, c), llvm::Align(4));
  }
  // A float in the function's entry block (promoted to a register by LLVM).
  llvm::AllocaInst* slot(const char* name) {
    llvm::IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
    return entry.CreateAlloca(f32, nullptr, name);
  }
  // The sum over j in [0, n) of term(j), in order.
  template <class Term> llvm::Value* sum(int64_t n, Term&& term) {
    llvm::AllocaInst* total = slot("sum");
    b.CreateStore(llvm::ConstantFP::get(f32, 0.0), total);
    forLoop(constant(0), constant(n), constant(1), "sum", [&](llvm::Value* j) {
      b.CreateStore(b.CreateFAdd(b.CreateLoad(f32, total), term(j)), total);
    });
    return b.CreateLoad(f32, total);
  }
  // sums[m * slices + s] += x(tileRow[m], k) * *weight(k, s) for k = begin, begin + stride, ...
  // below end: kGpuDepthUnroll depths' loads issued before their FMAs, then one depth at a time
  // for the rest, so that many loads are in flight at once (a depth at a time waited out a
  // load's latency per depth).
  template <class Weight>
  void accumulate(const std::vector<llvm::AllocaInst*>& sums, const View& x,
                  const std::vector<llvm::Value*>& tileRow, int64_t slices, llvm::Value* begin,
                  int64_t end, int64_t stride, Weight&& weight) {
    const int64_t rows = static_cast<int64_t>(tileRow.size());
    auto depths = [&](llvm::Value* k, int64_t n) {
      std::vector<llvm::Value*> w, xs;
      for (int64_t u = 0; u < n; ++u) {
        llvm::Value* ku = b.CreateAdd(k, constant(u * stride));
        for (int64_t s = 0; s < slices; ++s)
          w.push_back(b.CreateAlignedLoad(f32, weight(ku, s), llvm::Align(4)));
        for (int64_t m = 0; m < rows; ++m)
          xs.push_back(load(x, tileRow[static_cast<size_t>(m)], ku));
      }
      for (int64_t u = 0; u < n; ++u)
        for (int64_t m = 0; m < rows; ++m)
          for (int64_t s = 0; s < slices; ++s) {
            llvm::AllocaInst* acc = sums[static_cast<size_t>(m * slices + s)];
            b.CreateStore(fmuladd(xs[static_cast<size_t>(u * rows + m)],
                                  w[static_cast<size_t>(u * slices + s)], b.CreateLoad(f32, acc)),
                          acc);
          }
    };
    llvm::Value* group = constant(kGpuDepthUnroll * stride);
    // begin + a whole number of groups, the last group ending at or before end.
    llvm::Value* grouped = b.CreateAdd(
        begin, b.CreateMul(b.CreateSDiv(b.CreateSub(constant(end), begin), group), group));
    forLoop(begin, grouped, group, "depths", [&](llvm::Value* k) { depths(k, kGpuDepthUnroll); });
    forLoop(grouped, constant(end), constant(stride), "depth",
            [&](llvm::Value* k) { depths(k, 1); });
  }

  llvm::Value* fmuladd(llvm::Value* x, llvm::Value* y, llvm::Value* z) {
    return b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {f32}, {x, y, z});
  }

  const std::vector<GpuRegion>& regions_;
  KernelEmitter kernels_;
  View outputRows_;                    // a step region's output rows
  llvm::Value* lane_ = nullptr;        // a split-depth product's lane on a GPU; null when emulated
  llvm::Value* blockThread_ = nullptr; // a block tile's thread in its block on a GPU; likewise
};

} // namespace rnnc::codegen

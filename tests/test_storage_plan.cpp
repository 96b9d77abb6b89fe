// The storage plan: which values get buffers, and which state updates the kernels store in
// place. Numerics are covered by test_jit.cpp; these pin the decisions themselves.
#include "codegen/StoragePlan.h"
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "passes/PassManager.h"

#include <gtest/gtest.h>

#include <sstream>

using namespace rnnc;

namespace {

const codegen::Target kAvx2{"x86_64-unknown-linux-gnu", "znver3", "+avx2,+fma", 8, 16};
const codegen::Target kAvx512{"x86_64-unknown-linux-gnu", "skylake-avx512", "+avx512f", 16, 32};

// The plan's one fused product for `target`.
codegen::PackedProduct onlyProduct(const ir::Cell& cell, const codegen::Target& target) {
  codegen::StoragePlan plan = codegen::planStorage(cell, target);
  EXPECT_EQ(plan.packedProducts.size(), 1u);
  return plan.packedProducts.at(0);
}

std::unique_ptr<ir::Cell> optimised(std::unique_ptr<ir::Cell> cell, ir::SizeMap sizes,
                                    passes::PipelineOptions options = {}) {
  cell->bindSizes(sizes);
  std::ostringstream log;
  passes::runPipeline(*cell, options, log);
  return cell;
}

passes::PipelineOptions withoutMatMulFusion() {
  passes::PipelineOptions options;
  options.disabled.insert("fuse-matmul");
  return options;
}

TEST(StoragePlan, TheLstmKernelStoresBothStatesAndTheOutputDirectly) {
  auto lstm = optimised(frontend::loadCell("lstm"), {{"input_size", 3}, {"hidden_size", 4}},
                        withoutMatMulFusion());
  codegen::StoragePlan plan = codegen::planStorage(*lstm, kAvx2);
  EXPECT_EQ(plan.updatedInKernel, (std::vector<bool>{true, true}));
  EXPECT_TRUE(plan.outputInPlace);
  // Left to buffers: the pre block's input GEMM and the gates with the folded bias (both T*B
  // rows), and the step's GEMM result; none for c', h' or any gate.
  ASSERT_EQ(plan.buffers.size(), 3u);
  EXPECT_EQ(plan.buffers[0].rows, codegen::Rows::Sequence);
  EXPECT_EQ(plan.buffers[1].rows, codegen::Rows::Sequence);
  EXPECT_EQ(plan.buffers[2].rows, codegen::Rows::Step);
  EXPECT_EQ(plan.buffers[2].cols, 16);
}

TEST(StoragePlan, AFusedProductNeedsOnlyItsPackedWeights) {
  auto lstm = optimised(frontend::loadCell("lstm"), {{"input_size", 3}, {"hidden_size", 20}});
  codegen::StoragePlan plan = codegen::planStorage(*lstm, kAvx2);
  // h is read whole by the product in the kernel, so only c is stored over by the kernel; h'
  // goes straight into the output sequence and is copied to h after the step.
  EXPECT_EQ(plan.updatedInKernel, (std::vector<bool>{false, true}));
  // h is the output: later steps read it from the previous step's output rows, with no copy.
  EXPECT_EQ(plan.readFromOutput, (std::vector<bool>{true, false}));
  EXPECT_TRUE(plan.outputInPlace);
  // The pre block's two sequences, then the packed weights: 20 columns in blocks of 8 is 3
  // blocks, each 20 deep, each depth 4 slices of 8; no buffer for the [B, 80] gates.
  ASSERT_EQ(plan.buffers.size(), 3u);
  ASSERT_EQ(plan.packedProducts.size(), 1u);
  const codegen::PackedProduct& packed = plan.packedProducts[0];
  EXPECT_EQ(packed.buffer, 2u);
  EXPECT_TRUE(plan.buffers[2].packedWeights);
  EXPECT_EQ(plan.buffers[2].rows, codegen::Rows::Fixed);
  EXPECT_EQ(plan.buffers[2].fixedRows * plan.buffers[2].cols, 3 * 20 * 4 * 8);
  EXPECT_EQ(packed.offsets, (std::vector<int64_t>{0, 20, 40, 60}));
  EXPECT_EQ(packed.blocks, 3);
  EXPECT_EQ(packed.depth, 20);
  // AVX2: 12 accumulators, two slices per panel, so tiles of 6 rows; each panel holds two
  // slices side by side for every depth.
  EXPECT_EQ(packed.panelSlices, 2);
  EXPECT_EQ(packed.tileRows, 6);
  EXPECT_EQ(packed.sliceStart(1), 8);
  EXPECT_EQ(packed.sliceStart(2), 2 * 20 * 8);
  EXPECT_EQ(packed.panelWidth(3), 16);
}

TEST(StoragePlan, ASingleSliceIsTiledFourVectorsWide) {
  auto rnn = optimised(frontend::loadCell("rnn_tanh"), {{"input_size", 3}, {"hidden_size", 70}});
  // Four accumulator chains per row even at batch 1, and as many rows as the registers hold
  // beside four weight vectors and the broadcast: AVX2 2 rows (8 of 16 registers for
  // accumulators), AVX-512 6 rows (24 of 32).
  for (const auto& [target, rows] : {std::pair{kAvx2, 2}, std::pair{kAvx512, 6}}) {
    codegen::PackedProduct packed = onlyProduct(*rnn, target);
    EXPECT_EQ(packed.slices(), 1);
    EXPECT_EQ(packed.width, 4 * target.vectorWidth);
    EXPECT_EQ(packed.blocks, (70 + packed.width - 1) / packed.width);
    EXPECT_EQ(packed.tileRows, rows);
  }
}

TEST(StoragePlan, ThreeSlicesShareOnePassOfTheTile) {
  auto gru = optimised(frontend::loadCell("gru"), {{"input_size", 3}, {"hidden_size", 20}});
  // AVX2's 12 accumulators as 4 rows x 3 slices, AVX-512's 28 as 9 x 3: a panel of two slices
  // and one of one would leave the second pass only 6 (or 14) accumulators.
  for (const auto& [target, rows] : {std::pair{kAvx2, 4}, std::pair{kAvx512, 9}}) {
    codegen::PackedProduct packed = onlyProduct(*gru, target);
    EXPECT_EQ(packed.slices(), 3);
    EXPECT_EQ(packed.panelSlices, 3);
    EXPECT_EQ(packed.tileRows, rows);
    EXPECT_EQ(packed.panelWidth(2), 3 * target.vectorWidth);
    EXPECT_EQ(packed.sliceStart(2), 2 * target.vectorWidth);
  }
}

TEST(StoragePlan, AStateReadAfterItsNewValueIsCopiedAtTheEndOfTheStep) {
  auto cell = optimised(frontend::parseCell(R"(cell c(n) {
    input x[n]
    state h[n]
    h2 = tanh(x + h)
    return h = h2; output h2 * h
  })",
                                            "c.cell"),
                        {{"n", 5}});
  codegen::StoragePlan plan = codegen::planStorage(*cell, kAvx2);
  EXPECT_EQ(plan.updatedInKernel, std::vector<bool>{false});
}

TEST(StoragePlan, SwappedStatesAreStagedBeforeBeingOverwritten) {
  auto cell = optimised(frontend::parseCell(R"(cell s(n) {
    input x[n]
    state a[n], b[n]
    return a = b, b = a; output x + a
  })",
                                            "s.cell"),
                        {{"n", 5}});
  codegen::StoragePlan plan = codegen::planStorage(*cell, kAvx2);
  EXPECT_EQ(plan.updatedInKernel, (std::vector<bool>{false, false}));
  EXPECT_GE(plan.staging[0], 0);
  EXPECT_GE(plan.staging[1], 0);
}

} // namespace

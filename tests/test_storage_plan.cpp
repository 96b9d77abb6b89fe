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

std::unique_ptr<ir::Cell> optimised(std::unique_ptr<ir::Cell> cell, ir::SizeMap sizes) {
  cell->bindSizes(sizes);
  std::ostringstream log;
  passes::runPipeline(*cell, {}, log);
  return cell;
}

TEST(StoragePlan, TheLstmKernelStoresBothStatesAndTheOutputDirectly) {
  auto lstm = optimised(frontend::loadCell("lstm"), {{"input_size", 3}, {"hidden_size", 4}});
  codegen::StoragePlan plan = codegen::planStorage(*lstm);
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

TEST(StoragePlan, AStateReadAfterItsNewValueIsCopiedAtTheEndOfTheStep) {
  auto cell = optimised(frontend::parseCell(R"(cell c(n) {
    input x[n]
    state h[n]
    h2 = tanh(x + h)
    return h = h2; output h2 * h
  })",
                                            "c.cell"),
                        {{"n", 5}});
  codegen::StoragePlan plan = codegen::planStorage(*cell);
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
  codegen::StoragePlan plan = codegen::planStorage(*cell);
  EXPECT_EQ(plan.updatedInKernel, (std::vector<bool>{false, false}));
  EXPECT_GE(plan.staging[0], 0);
  EXPECT_GE(plan.staging[1], 0);
}

} // namespace

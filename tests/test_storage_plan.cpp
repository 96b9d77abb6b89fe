// The storage plan: which values get buffers, and which state updates the kernels store in
// place. Numerics are covered by test_jit.cpp; these pin the decisions themselves.
#include "codegen/StoragePlan.h"
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "passes/PassManager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

using namespace rnnc;

namespace {

const codegen::Target kPlanAvx2{"x86_64-unknown-linux-gnu", "znver3", "+avx2,+fma", 8, 16};
const codegen::Target kPlanAvx512{"x86_64-unknown-linux-gnu", "skylake-avx512", "+avx512f", 16, 32};

// The plan's recurrent product for `target`: the one split by columns (the input projection,
// in the pre block, is split by rows).
codegen::PackedProduct recurrentProduct(const ir::Cell& cell, const codegen::Target& target) {
  codegen::StoragePlan plan = codegen::planStorage(cell, target);
  std::vector<codegen::PackedProduct> recurrent;
  for (const codegen::PackedProduct& packed : plan.packedProducts)
    if (!packed.splitRows)
      recurrent.push_back(packed);
  EXPECT_EQ(recurrent.size(), 1u);
  return recurrent.at(0);
}

int countRows(const codegen::StoragePlan& plan, codegen::Rows rows, bool packedWeights) {
  return static_cast<int>(
      std::count_if(plan.buffers.begin(), plan.buffers.end(), [&](const auto& buffer) {
        return buffer.rows == rows && buffer.packedWeights == packedWeights;
      }));
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
  codegen::StoragePlan plan = codegen::planStorage(*lstm, kPlanAvx2);
  EXPECT_EQ(plan.updatedInKernel, (std::vector<bool>{true, true}));
  EXPECT_TRUE(plan.outputInPlace);
  // Left to buffers: the pre block's input product and the gates with the folded bias (both
  // T*B rows), the step's product result, both products' packed weights and each thread's
  // copies of their x rows (the input product: a chunk of rows each; the step's: all B rows);
  // none for c', h' or any gate.
  ASSERT_EQ(plan.buffers.size(), 7u);
  EXPECT_EQ(countRows(plan, codegen::Rows::Sequence, false), 2);
  EXPECT_EQ(countRows(plan, codegen::Rows::Step, false), 1);
  EXPECT_EQ(countRows(plan, codegen::Rows::Fixed, true), 2);
  EXPECT_EQ(countRows(plan, codegen::Rows::PerThread, false), 1);
  EXPECT_EQ(countRows(plan, codegen::Rows::PerThreadStep, false), 1);
  // Both products are standalone (fuse-matmul is off) and stored; the input product's T*B rows
  // are split between threads, the step's B rows are not: threads take its column blocks.
  ASSERT_EQ(plan.packedProducts.size(), 2u);
  for (const codegen::PackedProduct& packed : plan.packedProducts) {
    EXPECT_TRUE(packed.standalone());
    const bool inPre = std::any_of(lstm->pre.begin(), lstm->pre.end(), [&](const auto& instr) {
      return instr.get() == packed.product;
    });
    EXPECT_EQ(packed.splitRows, inPre);
    EXPECT_EQ(plan.buffers.at(plan.bufferOf.at(&packed.product->result)).cols, 16);
  }
}

// The values of a cell's step (a = tanh(x w^T + h), b = sigmoid(a), c = exp(a)) that lie in the
// columns of its output `output` for `target`, as (first column, columns); none has a buffer.
std::multiset<std::pair<int64_t, int64_t>> placedInOutput(const std::string& output,
                                                          const codegen::Target& target) {
  auto cell = optimised(frontend::parseCell(R"(cell t(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size]
  a = tanh(x @ w^T + h)
  b = sigmoid(a)
  c = exp(a)
  return h = a; output )" + output + "\n}",
                                            "t.cell"),
                        {{"input_size", 3}, {"hidden_size", 4}});
  codegen::StoragePlan plan = codegen::planStorage(*cell, target);
  EXPECT_TRUE(plan.outputInPlace);
  std::multiset<std::pair<int64_t, int64_t>> placed;
  for (const auto& [value, column] : plan.inOutputColumns) {
    EXPECT_EQ(plan.bufferOf.count(value), 0u) << "column " << column;
    placed.insert({column, ir::columnsOf(value)});
  }
  return placed;
}

using Places = std::multiset<std::pair<int64_t, int64_t>>;

// An output that concatenates step values: they are stored straight into their columns of the
// output rows (no buffer, no copy), a value given twice at its first place (the concat copies
// it to the second); a state is copied by the concat. Not on a GPU, whose regions write buffers.
TEST(StoragePlan, AConcatOutputsPartsAreStoredInTheirColumns) {
  EXPECT_EQ(placedInOutput("cat(a, h, b, b)", kPlanAvx2), (Places{{0, 4}, {8, 4}}));
  EXPECT_TRUE(placedInOutput("cat(a, h, b, b)", codegen::gpuTarget("sm_80")).empty());
}

// Concats within a concat output (a GRU backward's [dgates_x | dgates_h], which share dr and dz)
// lie in the output's columns, and so do their parts, each at its first place: the first
// concat (12 columns) with b at 0, c at 4 and a at 8; the second at 12 (its h a state, copied,
// and b and c copied from their first places).
TEST(StoragePlan, TheConcatsWithinAConcatOutputAndTheirPartsAreStoredInItsColumns) {
  EXPECT_EQ(placedInOutput("cat(cat(b, c, a), cat(b, c, h))", kPlanAvx2),
            (Places{{0, 12}, {0, 4}, {4, 4}, {8, 4}, {12, 12}}));
}

// A state whose next value lies in the output's columns (a training forward's h, beside what its
// backward reads) is read from the previous step's output rows there, as one whose next value is
// the output is: no copy per step.
TEST(StoragePlan, AStateWhoseNextValueIsInTheOutputsColumnsIsReadFromThem) {
  for (const auto& [output, column] :
       {std::pair<std::string, int64_t>{"cat(b, a)", 4}, {"cat(a, b)", 0}}) {
    SCOPED_TRACE(output);
    auto cell = optimised(frontend::parseCell(R"(cell t(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size]
  a = tanh(x @ w^T + h @ u^T)
  b = sigmoid(a)
  return h = a; output )" + output + "\n}",
                                              "t.cell"),
                          {{"input_size", 3}, {"hidden_size", 4}});
    codegen::StoragePlan plan = codegen::planStorage(*cell, kPlanAvx2);
    EXPECT_EQ(plan.readFromOutput, (std::vector<bool>{true}));
    EXPECT_EQ(plan.readFromOutputColumn, (std::vector<int64_t>{column}));
  }
}

TEST(StoragePlan, AFusedProductNeedsOnlyItsPackedWeights) {
  auto lstm = optimised(frontend::loadCell("lstm"), {{"input_size", 3}, {"hidden_size", 20}});
  codegen::StoragePlan plan = codegen::planStorage(*lstm, kPlanAvx2);
  // h is read whole by the product in the kernel, so only c is stored over by the kernel; h'
  // goes straight into the output sequence and is copied to h after the step.
  EXPECT_EQ(plan.updatedInKernel, (std::vector<bool>{false, true}));
  // h is the output: later steps read it from the previous step's output rows, with no copy.
  EXPECT_EQ(plan.readFromOutput, (std::vector<bool>{true, false}));
  EXPECT_TRUE(plan.outputInPlace);
  // The gates with the folded bias (T*B rows), both products' packed weights: no buffer
  // for the [T*B, 80] input product (its kernel adds the biases to each tile) nor for the
  // [B, 80] gates. The recurrent product: 20 columns in blocks of 8 is 3 blocks, each 20 deep,
  // each depth 4 slices of 8.
  // Each thread copies the rows of x and of h it multiplies: a chunk of the input projection's
  // rows, all B rows of h (PerThreadStep).
  ASSERT_EQ(plan.buffers.size(), 5u);
  EXPECT_EQ(countRows(plan, codegen::Rows::Sequence, false), 1);
  EXPECT_EQ(countRows(plan, codegen::Rows::Fixed, true), 2);
  EXPECT_EQ(countRows(plan, codegen::Rows::PerThread, false), 1);
  EXPECT_EQ(countRows(plan, codegen::Rows::PerThreadStep, false), 1);
  codegen::PackedProduct packed = recurrentProduct(*lstm, kPlanAvx2);
  EXPECT_FALSE(packed.standalone());
  EXPECT_TRUE(plan.buffers.at(packed.buffer).packedWeights);
  EXPECT_EQ(plan.buffers[packed.buffer].fixedRows * plan.buffers[packed.buffer].cols,
            3 * 20 * 4 * 8);
  EXPECT_EQ(packed.offsets, (std::vector<int64_t>{0, 20, 40, 60}));
  EXPECT_EQ(packed.blocks, 3);
  EXPECT_EQ(packed.depth, 20);
  // AVX2: 12 accumulators, two slices a pass, so tiles of 6 rows; one panel holds the four
  // slices side by side for every depth (a single row reads one stream).
  EXPECT_EQ(packed.passSlices, 2);
  EXPECT_EQ(packed.panelSlices, 4);
  EXPECT_EQ(packed.tileRows, 6);
  EXPECT_EQ(packed.sliceStart(1), 8);
  EXPECT_EQ(packed.sliceStart(2), 16);
  EXPECT_EQ(packed.panelWidth(3), 32);
}

// A step's fp32 products keep every slice in one panel, so that a single row reads one stream;
// fp16 and bf16 ones (widened as they are loaded, or bf16 pairs for vdpbf16ps) do where the
// step's weights are past L2 (the targets' 512 KB: the LSTM's W_hh at H = 512 in 2 bytes a
// weight is 2 MB, at H = 256 512 KB). The input projection (over the sequence's rows) and int8
// products keep panels of what a pass reads. Zen's code widens fp16 weights as it loads them at
// any size (Target::widensFp16BesideFmas), so none are widened at packing here.
TEST(StoragePlan, AStepsProductsPackEverySliceInOnePanelWhereOneStreamIsFaster) {
  const codegen::Target avx2{"x86_64-unknown-linux-gnu", "znver3", "+avx2,+fma,+f16c", 8, 16};
  const codegen::Target avx512{"x86_64-unknown-linux-gnu", "znver4", "+avx2,+fma,+avx512f,+f16c",
                               16, 32};
  const codegen::Target avx512Bf16{"x86_64-unknown-linux-gnu", "znver4",
                                   "+avx2,+fma,+avx512f,+f16c,+avx512bf16", 16, 32};
  struct Case {
    const codegen::Target& target;
    codegen::WeightType weights;
    int64_t hidden;
    bool onePanel;
  };
  using codegen::WeightType;
  for (const Case& c :
       {Case{avx2, WeightType::F32, 512, true}, Case{avx512, WeightType::F32, 512, true},
        Case{avx2, WeightType::F32, 256, true}, Case{avx512, WeightType::F32, 256, true},
        Case{avx2, WeightType::F16, 512, true}, Case{avx512, WeightType::F16, 512, true},
        Case{avx2, WeightType::F16, 256, false}, Case{avx512, WeightType::F16, 256, false},
        Case{avx2, WeightType::BF16, 512, true}, Case{avx2, WeightType::BF16, 256, false},
        Case{avx512Bf16, WeightType::BF16, 512, true},
        Case{avx512Bf16, WeightType::BF16, 256, false}, Case{avx2, WeightType::I8, 512, false},
        Case{avx512, WeightType::I8, 512, false}}) {
    auto lstm = optimised(frontend::loadCell("lstm"),
                          {{"input_size", c.hidden}, {"hidden_size", c.hidden}});
    const std::string what = c.target.features + " " +
                             std::string(codegen::weightTypeName(c.weights)) +
                             " H = " + std::to_string(c.hidden);
    int steps = 0;
    for (const codegen::PackedProduct& packed :
         codegen::planStorage(*lstm, c.target, c.weights).packedProducts) {
      EXPECT_EQ(packed.weights, c.weights) << what;
      if (packed.splitRows) {
        EXPECT_EQ(packed.panelSlices, packed.passSlices) << what;
        continue;
      }
      ++steps;
      EXPECT_EQ(packed.slices(), 4) << what;
      EXPECT_EQ(packed.passSlices, 2) << what;
      EXPECT_EQ(packed.panelSlices, c.onePanel ? 4 : 2) << what;
    }
    EXPECT_EQ(steps, 1) << what;
  }
}

TEST(StoragePlan, ASingleSliceIsTiledFourVectorsWideWhereL1HoldsTheBlock) {
  // H = 70: four accumulator chains per row even at batch 1, and as many rows as the registers
  // hold beside four weight vectors and the broadcast: AVX2 2 rows (8 of 16 registers for
  // accumulators), AVX-512 6 rows (24 of 32). H = 512: L1 does not hold a block of four vectors
  // over the depth (64 KB at AVX2, 128 KB at AVX-512) and every row tile streams it from L2:
  // the SGEMM tile's 2 vectors by 6 or 14 rows read a weight vector per 6 or 14 FMAs, where 2 or
  // 6 rows by 4 vectors read one per 2 or 6.
  struct Case {
    int64_t hidden, vectors, avx2Rows, avx512Rows;
  };
  for (const Case& c : {Case{70, 4, 2, 6}, Case{512, 2, 6, 14}}) {
    auto rnn =
        optimised(frontend::loadCell("rnn_tanh"), {{"input_size", 3}, {"hidden_size", c.hidden}});
    for (const auto& [target, rows] :
         {std::pair{kPlanAvx2, c.avx2Rows}, std::pair{kPlanAvx512, c.avx512Rows}}) {
      codegen::PackedProduct packed = recurrentProduct(*rnn, target);
      EXPECT_EQ(packed.slices(), 1);
      EXPECT_EQ(packed.depth, c.hidden);
      EXPECT_EQ(packed.width, c.vectors * target.vectorWidth) << "H = " << c.hidden;
      EXPECT_EQ(packed.blocks, (c.hidden + packed.width - 1) / packed.width);
      EXPECT_EQ(packed.tileRows, rows) << "H = " << c.hidden;
    }
  }
}

TEST(StoragePlan, ThreeSlicesShareOnePassOfTheTile) {
  auto gru = optimised(frontend::loadCell("gru"), {{"input_size", 3}, {"hidden_size", 20}});
  // AVX2's 12 accumulators as 4 rows x 3 slices, AVX-512's 28 as 9 x 3: a panel of two slices
  // and one of one would leave the second pass only 6 (or 14) accumulators.
  for (const auto& [target, rows] : {std::pair{kPlanAvx2, 4}, std::pair{kPlanAvx512, 9}}) {
    codegen::PackedProduct packed = recurrentProduct(*gru, target);
    EXPECT_EQ(packed.slices(), 3);
    EXPECT_EQ(packed.panelSlices, 3);
    EXPECT_EQ(packed.tileRows, rows);
    EXPECT_EQ(packed.panelWidth(2), 3 * target.vectorWidth);
    EXPECT_EQ(packed.sliceStart(2), 2 * target.vectorWidth);
  }
}

TEST(StoragePlan, TheInputProjectionIsTiledOverRowsInChunksThatFitInL2) {
  auto lstm = optimised(frontend::loadCell("lstm"), {{"input_size", 300}, {"hidden_size", 20}});
  for (const auto& [target, rows] : {std::pair{kPlanAvx2, 6}, std::pair{kPlanAvx512, 14}}) {
    codegen::Target sized = target;
    sized.l2Bytes = 1 << 20;
    codegen::StoragePlan plan = codegen::planStorage(*lstm, sized);
    ASSERT_EQ(plan.packedProducts.size(), 2u);
    const codegen::PackedProduct& input = plan.packedProducts[0];
    EXPECT_EQ(input.product->operands[0]->name, "x");
    // Fused into the kernel that adds the biases: one slice of all 80 columns, in the classic
    // SGEMM tile (2 vectors wide, 6 rows on AVX2, 14 on AVX-512), split by rows.
    EXPECT_FALSE(input.standalone());
    EXPECT_TRUE(input.splitRows);
    EXPECT_EQ(input.slices(), 1);
    EXPECT_EQ(input.columns, 80);
    EXPECT_EQ(input.width, 2 * target.vectorWidth);
    EXPECT_EQ(input.tileRows, rows);
    // Half of the 1 MB L2 would hold 436 rows of x (1200 bytes each); at most 256, whole tiles.
    EXPECT_EQ(input.chunkRows, 256 / rows * rows);
    // Each thread copies a chunk's rows of x at an odd number of lines per row: 300 floats
    // round up to 19 lines of 16.
    EXPECT_EQ(input.xStride, 19 * 16);
  }
}

// Products whose depths are within a factor of two copy their rows of x as far apart as the
// deepest's (so that one walk over the depth serves them), the buffers sized alike; further
// apart, each keeps its own.
TEST(StoragePlan, CopiesOfXOfSimilarDepthsShareTheDeepestsRowStride) {
  for (const auto& [input, hidden, inputStride, hiddenStride] :
       {std::tuple{256, 512, 33 * 16, 33 * 16}, std::tuple{1024, 600, 65 * 16, 65 * 16},
        std::tuple{1024, 256, 65 * 16, 17 * 16}}) {
    auto lstm =
        optimised(frontend::loadCell("lstm"), {{"input_size", input}, {"hidden_size", hidden}});
    codegen::StoragePlan plan = codegen::planStorage(*lstm, kPlanAvx512);
    ASSERT_EQ(plan.packedProducts.size(), 2u);
    for (const codegen::PackedProduct& product : plan.packedProducts) {
      const bool ofX = product.product->operands[0]->name == "x";
      EXPECT_EQ(product.depth, ofX ? input : hidden);
      EXPECT_EQ(product.xStride, ofX ? inputStride : hiddenStride) << input << " " << hidden;
      EXPECT_EQ(plan.buffers[product.xBuffer].cols, product.xStride);
    }
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
  codegen::StoragePlan plan = codegen::planStorage(*cell, kPlanAvx2);
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
  codegen::StoragePlan plan = codegen::planStorage(*cell, kPlanAvx2);
  EXPECT_EQ(plan.updatedInKernel, (std::vector<bool>{false, false}));
  EXPECT_GE(plan.staging[0], 0);
  EXPECT_GE(plan.staging[1], 0);
}

} // namespace

// fp16 weights of the step's products are widened to fp32 at packing where the step's fp32
// weights fit in half of L2 (on Intel's cores they are read from L2 faster than fp16 is
// widened), and stay fp16 where they do not, where asked to stay, in the input projection (many
// rows per weight widened) and on AMD's cores. An LSTM at H = 256 has 1 MB of fp32 W_hh: widened
// with a 2 MB L2, not with 1 MB.
TEST(StoragePlan, Fp16StepWeightsAreWidenedWhereTheirFp32FitsHalfOfL2) {
  using codegen::WeightType;
  const codegen::Target f16Cpu{"x86_64-unknown-linux-gnu", "sapphirerapids", "+avx2,+avx512f,+f16c",
                               16, 32};
  auto lstm = optimised(frontend::loadCell("lstm"), {{"input_size", 256}, {"hidden_size", 256}});
  auto stepAndPre = [&](int64_t l2Bytes, bool widen, WeightType weights = WeightType::F16) {
    codegen::Target target = f16Cpu;
    target.l2Bytes = l2Bytes;
    std::map<bool, codegen::PackedProduct> bySplit; // splitRows: the input projection
    for (const codegen::PackedProduct& packed :
         codegen::planStorage(*lstm, target, weights, codegen::kGpuStepBlockTiles, widen)
             .packedProducts)
      bySplit.emplace(packed.splitRows, packed);
    EXPECT_EQ(bySplit.size(), 2u);
    return bySplit;
  };
  auto widened = stepAndPre(2 << 20, true);
  EXPECT_EQ(widened[false].weights, WeightType::F32);
  EXPECT_EQ(widened[false].widenedFrom, WeightType::F16);
  EXPECT_EQ(widened[false].packedElementBytes(), 4);
  EXPECT_EQ(widened[true].weights, WeightType::F16);
  EXPECT_EQ(widened[true].widenedFrom, WeightType::F32);
  // The widened product is planned as an fp32 one: the same tiles.
  const codegen::PackedProduct fp32 = stepAndPre(2 << 20, true, WeightType::F32)[false];
  EXPECT_EQ(widened[false].width, fp32.width);
  EXPECT_EQ(widened[false].tileRows, fp32.tileRows);
  for (auto [l2Bytes, widen] :
       {std::pair{int64_t{1} << 20, true}, std::pair{int64_t{2} << 20, false}})
    for (const auto& [split, packed] : stepAndPre(l2Bytes, widen)) {
      EXPECT_EQ(packed.weights, WeightType::F16) << l2Bytes << (widen ? " widen" : " keep");
      EXPECT_EQ(packed.widenedFrom, WeightType::F32);
    }
  for (WeightType other : {WeightType::F32, WeightType::BF16, WeightType::I8})
    for (const auto& [split, packed] : stepAndPre(2 << 20, true, other)) {
      EXPECT_EQ(packed.weights, other);
      EXPECT_EQ(packed.widenedFrom, WeightType::F32);
    }
  // AMD's cores widen fp16 beside their FMAs (Target::widensFp16BesideFmas): fp16 tiles however
  // much L2 there is, in AVX-512 and AVX2 code alike.
  for (const char* amdCpu : {"znver5", "znver3"}) {
    codegen::Target amd = f16Cpu;
    amd.cpu = amdCpu;
    amd.l2Bytes = 2 << 20;
    EXPECT_TRUE(amd.widensFp16BesideFmas());
    for (const codegen::PackedProduct& packed :
         codegen::planStorage(*lstm, amd, WeightType::F16, codegen::kGpuStepBlockTiles, true)
             .packedProducts) {
      EXPECT_EQ(packed.weights, WeightType::F16) << amdCpu;
      EXPECT_EQ(packed.widenedFrom, WeightType::F32) << amdCpu;
    }
  }
  EXPECT_FALSE(f16Cpu.widensFp16BesideFmas());
}

// bf16 weights are packed in depth pairs for vdpbf16ps where the CPU has AVX512_BF16 and runs it
// as fast as an FMA (AMD's; half the packed depth, 4-byte elements, an odd depth padded), and as
// 2-byte weights widened in registers elsewhere, Intel's AVX512_BF16 included; other types never
// pair.
TEST(StoragePlan, Bf16WeightsPairDepthsOnlyWhereVdpbf16psIsFast) {
  const codegen::Target bf16Cpu{"x86_64-unknown-linux-gnu", "znver4", "+avx512f,+avx512bf16,+f16c",
                                16, 32};
  auto lstm = optimised(frontend::loadCell("lstm"), {{"input_size", 7}, {"hidden_size", 9}});
  auto productsOf = [&](const codegen::Target& target, codegen::WeightType weights) {
    return codegen::planStorage(*lstm, target, weights).packedProducts;
  };
  for (const codegen::PackedProduct& packed : productsOf(bf16Cpu, codegen::WeightType::BF16)) {
    EXPECT_TRUE(packed.depthPairs);
    EXPECT_EQ(packed.packedDepth(), (packed.depth + 1) / 2);
    EXPECT_EQ(packed.packedElementBytes(), 4);
  }
  codegen::Target intelBf16Cpu = bf16Cpu;
  intelBf16Cpu.cpu = "sapphirerapids";
  for (const codegen::Target& target : {kPlanAvx512, intelBf16Cpu})
    for (const codegen::PackedProduct& packed : productsOf(target, codegen::WeightType::BF16)) {
      EXPECT_FALSE(packed.depthPairs) << target.cpu;
      EXPECT_EQ(packed.packedDepth(), packed.depth);
      EXPECT_EQ(packed.packedElementBytes(), 2);
    }
  for (auto weights : {codegen::WeightType::F32, codegen::WeightType::F16})
    for (const codegen::PackedProduct& packed : productsOf(bf16Cpu, weights))
      EXPECT_FALSE(packed.depthPairs);
}

// bf16 weights on a CPU with AMX-BF16 and int8 ones with AMX-INT8 go to its tiles: bf16 in
// depth pairs, int8 in groups of 4 depths, the packed depth padded to whole tiles of 16 words
// (32 bf16 depths, 64 int8 ones), tiles of 2 x 16 rows; never without the AMX feature of the
// type, nor for fp32 and fp16.
TEST(StoragePlan, Bf16AndInt8WeightsGoToAmxTilesWhereTheCpuHasThem) {
  const codegen::Target amxCpu{"x86_64-unknown-linux-gnu", "sapphirerapids",
                               "+avx2,+avx512f,+avx512bf16,+f16c,+amx-tile,+amx-bf16,+amx-int8", 16,
                               32};
  using codegen::WeightType;
  for (int64_t input : {7, 33, 64, 65}) {
    auto lstm = optimised(frontend::loadCell("lstm"), {{"input_size", input}, {"hidden_size", 9}});
    auto productsOf = [&](const codegen::Target& target, WeightType weights) {
      return codegen::planStorage(*lstm, target, weights).packedProducts;
    };
    for (WeightType weights : {WeightType::BF16, WeightType::I8})
      for (const codegen::PackedProduct& packed : productsOf(amxCpu, weights)) {
        const int64_t perWord = weights == WeightType::I8 ? 4 : 2;
        EXPECT_TRUE(packed.amxTiles);
        EXPECT_EQ(packed.depthPairs, weights == WeightType::BF16);
        EXPECT_EQ(packed.packedDepth(), (packed.depth + 16 * perWord - 1) / (16 * perWord) * 16)
            << packed.depth;
        EXPECT_EQ(packed.packedElementBytes(), 4);
        EXPECT_EQ(packed.tileRows, 32); // two tiles of 16 rows
        EXPECT_TRUE(packed.width == 16 || packed.width == 32) << packed.width;
      }
    for (WeightType weights : {WeightType::F32, WeightType::F16})
      for (const codegen::PackedProduct& packed : productsOf(amxCpu, weights))
        EXPECT_FALSE(packed.amxTiles);
    codegen::Target int8Only = amxCpu, bf16Only = amxCpu;
    int8Only.features = "+avx2,+avx512f,+avx512bf16,+f16c,+amx-tile,+amx-int8";
    bf16Only.features = "+avx2,+avx512f,+avx512bf16,+f16c,+amx-tile,+amx-bf16";
    for (const codegen::PackedProduct& packed : productsOf(int8Only, WeightType::BF16))
      EXPECT_FALSE(packed.amxTiles);
    for (const codegen::PackedProduct& packed : productsOf(bf16Only, WeightType::I8))
      EXPECT_FALSE(packed.amxTiles);
  }
}

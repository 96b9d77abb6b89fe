// The GPU code generator (issue 15) without a GPU: every cell's PTX passes ptxas for sm_80 and
// sm_90, and the kernels' own code, compiled for this machine and run region by region with
// the GPU threads one after the other (forwards and backwards), matches the interpreter under
// every pass setting. With a GPU (CUDA driver present) the same cells run on it too.
#include "codegen/Compiler.h"
#include "codegen/GpuPlan.h"
#include "codegen/StoragePlan.h"
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "ir/Verifier.h"
#include "passes/Autodiff.h"
#include "runtime/exec/Interpreter.h"
#include "runtime/gpu/CudaDriver.h"
#include "runtime/gpu/GpuCell.h"
#include "tests/PassSettings.h"
#include "tests/RegressionCells.h"
#include "tests/TestSupport.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <vector>

using namespace rnnc;

namespace {

const char* kPtxas = "/usr/local/cuda/bin/ptxas";

// States that swap (each next value is the other's state: staged before either is written),
// a layer norm, a stack of weights and an output that is not a state.
const char* kSwapNormStack = R"(cell swap_norm_stack(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size], c[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size], v[hidden_size, hidden_size]
  a = layernorm(linear(x, w) + linear(h, u)) * 0.5
  b = tanh(linear(c, v)) - a
  return h = c, c = h; output a * b
})";

// A cell bound to small odd sizes (tails of the 32-column blocks and 4-row tiles), its
// parameters, and random inputs and initial states for T steps of B rows.
struct GpuCase {
  std::unique_ptr<ir::Cell> cell;
  std::vector<Tensor> params, inputs, states;
};

GpuCase makeCase(const ir::Cell& source, int64_t steps, int64_t batch, unsigned seed,
                 const ir::SizeMap& all = {
                     {"input_size", 5}, {"hidden_size", 9}, {"proj_size", 4}}) {
  GpuCase c;
  c.cell = source.clone();
  ir::SizeMap sizes;
  for (const std::string& name : source.sizeNames)
    sizes[name] = all.at(name);
  c.cell->bindSizes(sizes);
  ir::verify(*c.cell);
  std::mt19937 rng(seed);
  TensorMap weights = test::randomWeights(*c.cell, sizes, rng);
  for (const auto& p : c.cell->params)
    c.params.push_back(weights.at(p->name));
  for (const auto& input : c.cell->inputs)
    c.inputs.push_back(
        test::randomTensor({steps, batch, input->shape.back().constantValue()}, rng, 1.0f));
  for (const auto& state : c.cell->states)
    c.states.push_back(test::randomTensor({batch, state->shape.back().constantValue()}, rng));
  return c;
}

// `run` (the GPU's code, emulated or on a GPU, given the initial states to update) against the
// interpreter on the same case: outputs and final states within `tolerance`.
template <class Run>
void expectLikeTheInterpreter(const GpuCase& c, Run&& run, double tolerance = 1e-5) {
  std::vector<Tensor> expectedStates = c.states;
  Tensor expected = Interpreter(*c.cell, c.params).run(c.inputs, expectedStates);
  std::vector<Tensor> states = c.states;
  Tensor output = run(states);
  ASSERT_EQ(output.shape(), expected.shape());
  EXPECT_LT(test::maxAbsDiff(output, expected), tolerance);
  for (size_t s = 0; s < states.size(); ++s)
    EXPECT_LT(test::maxAbsDiff(states[s], expectedStates[s]), tolerance) << c.cell->states[s]->name;
}

// The pass settings that change what the GPU runs: each makes other regions (products in the
// step, standalone products and kernels, unmerged gates, layer norms and copies alone); the
// rest only rename or reorder the same ones, and the CPU's tests run them all.
std::vector<test::PassSetting> gpuPassSettings() {
  std::vector<test::PassSetting> settings;
  for (const test::PassSetting& setting : test::everyPassSetting())
    if (setting.name == "default" || setting.name == "--no-premul" || setting.name == "--no-fuse" ||
        setting.name == "--disable-pass fuse-matmul" ||
        setting.name == "--disable-pass merge-gates" || setting.name == "--disable-pass simplify")
      settings.push_back(setting);
  return settings;
}

// The emulated kernels against the interpreter, under the pass settings above, for a few grid sizes
// (one thread; fewer threads than items; more) in both orders of the threads.
void expectEmulationMatchesTheInterpreter(const ir::Cell& source) {
  GpuCase c = makeCase(source, 4, 6, 11);
  std::vector<Tensor> expectedStates = c.states;
  Tensor expected = Interpreter(*c.cell, c.params).run(c.inputs, expectedStates);
  for (const test::PassSetting& setting : gpuPassSettings()) {
    GpuCell::Options options;
    options.pipeline = setting.pipeline;
    options.gpu = "sm_80";
    std::shared_ptr<GpuCell> gpu = GpuCell::compile(*c.cell, options);
    for (int64_t threads : {1, 7, 1000})
      for (bool reversed : {false, true}) {
        SCOPED_TRACE(source.name + ", " + setting.name + ", " + std::to_string(threads) +
                     " threads" + (reversed ? ", reversed" : ""));
        std::vector<Tensor> states = c.states;
        Tensor output = gpu->emulate(c.params, c.inputs, states, threads, reversed);
        EXPECT_LT(test::maxAbsDiff(output, expected), 1e-5);
        for (size_t s = 0; s < states.size(); ++s)
          EXPECT_LT(test::maxAbsDiff(states[s], expectedStates[s]), 1e-5) << source.states[s]->name;
      }
  }
}

std::vector<std::unique_ptr<ir::Cell>> cellsUnderTest() {
  std::vector<std::unique_ptr<ir::Cell>> cells;
  for (const std::string& name : frontend::builtinCellNames())
    cells.push_back(frontend::loadCell(name));
  for (const auto& [name, source] : test::kRegressionCells)
    cells.push_back(frontend::parseCell(source, std::string(name) + ".cell"));
  cells.push_back(frontend::parseCell(kSwapNormStack, "swap_norm_stack.cell"));
  return cells;
}

TEST(GpuEmulation, EveryBuiltinAndRegressionCellMatchesTheInterpreter) {
  for (const auto& cell : cellsUnderTest())
    expectEmulationMatchesTheInterpreter(*cell);
}

// The backward step of every built-in cell (passes/Autodiff.h): products of batched gradients
// by transposed weights, layer norm gradients, wide concatenations.
TEST(GpuEmulation, EveryBuiltinCellsBackwardMatchesTheInterpreter) {
  for (const std::string& name : frontend::builtinCellNames())
    expectEmulationMatchesTheInterpreter(*passes::deriveBackward(*frontend::loadCell(name)).cell);
}

// The persistent kernel's steps on 1 to 3 host threads at once, each a one-thread block meeting
// the others at the grid barrier after every region: a barrier that let a block run ahead (a
// wrong generation count) would read rows another block has not written yet.
TEST(GpuEmulation, PersistentStepsMatchTheInterpreter) {
  for (const auto& source : cellsUnderTest()) {
    GpuCase c = makeCase(*source, 5, 6, 7);
    GpuCell::Options options;
    options.gpu = "sm_80";
    std::shared_ptr<GpuCell> gpu = GpuCell::compile(*c.cell, options);
    for (int blocks : {1, 2, 3}) {
      SCOPED_TRACE(source->name + ", " + std::to_string(blocks) + " blocks");
      expectLikeTheInterpreter(c, [&](std::vector<Tensor>& states) {
        return gpu->emulatePersistent(c.params, c.inputs, states, blocks);
      });
    }
  }
}

// Batches that run the step's products in block tiles (33 rows: two full tiles and one of a
// single row; 9 hidden columns: part of a block; depths of 5 and 9: part of one chunk, which
// three of the step's four depth groups have none of), every cell, each block's threads one after
// the other between its barriers, the blocks forwards and backwards, and as the persistent kernel
// on 2 host threads; the tiles on the tensor cores (each lane's sums as its fragments hold
// them) and in FMAs.
TEST(GpuEmulation, EveryCellAtABlockTiledBatchMatchesTheInterpreter) {
  for (const auto& source : cellsUnderTest())
    for (bool tensorCores : {true, false}) {
      GpuCase c = makeCase(*source, 3, codegen::kGpuBlockTiledBatch + 1, 13);
      GpuCell::Options options;
      options.gpu = "sm_90";
      options.tensorCores = tensorCores;
      std::shared_ptr<GpuCell> gpu = GpuCell::compile(*c.cell, options);
      for (int way = 0; way < 3; ++way) {
        SCOPED_TRACE(source->name + (tensorCores ? ", tensor cores" : ", FMAs") +
                     (way == 0   ? ", forwards"
                      : way == 1 ? ", backwards"
                                 : ", persistent"));
        expectLikeTheInterpreter(c, [&](std::vector<Tensor>& states) {
          return way == 2 ? gpu->emulatePersistent(c.params, c.inputs, states, 2)
                          : gpu->emulate(c.params, c.inputs, states, 5, way == 1);
        });
      }
    }
}

// Depths of several chunks of a block tile (37 inputs: two whole chunks of 16 and part of a third;
// 70 hidden: four and part of a fifth, which a step's 4 depth groups take 2, 2, 1 and none),
// each chunk's loads issued while the one before is summed.
TEST(GpuEmulation, BlockTilesWalkDepthsOfSeveralChunks) {
  for (const char* name : {"lstm", "gru"})
    for (bool tensorCores : {true, false}) {
      SCOPED_TRACE(std::string(name) + (tensorCores ? ", tensor cores" : ", FMAs"));
      GpuCase c = makeCase(*frontend::loadCell(name), 2, codegen::kGpuBlockTiledBatch + 3, 17,
                           {{"input_size", 37}, {"hidden_size", 70}});
      GpuCell::Options options;
      options.gpu = "sm_90";
      options.tensorCores = tensorCores;
      std::shared_ptr<GpuCell> gpu = GpuCell::compile(*c.cell, options);
      expectLikeTheInterpreter(c, [&](std::vector<Tensor>& states) {
        return gpu->emulate(c.params, c.inputs, states, 3);
      });
    }
}

// A sequence of one step, one row, and of none: the final states are the initial ones.
TEST(GpuEmulation, EdgeLengths) {
  auto lstm = frontend::loadCell("lstm");
  for (auto [steps, batch] : {std::pair<int64_t, int64_t>{1, 1}, {0, 3}, {3, 33}}) {
    SCOPED_TRACE(std::to_string(steps) + " steps of " + std::to_string(batch));
    GpuCase c = makeCase(*lstm, steps, batch, 5);
    GpuCell::Options options;
    options.gpu = "sm_90";
    std::shared_ptr<GpuCell> gpu = GpuCell::compile(*c.cell, options);
    expectLikeTheInterpreter(c, [&](std::vector<Tensor>& states) {
      return gpu->emulate(c.params, c.inputs, states, 64);
    });
  }
}

// The plan of the default LSTM: both weights packed once, the input projection of all steps
// one product (the biases added in its epilogue), each step one region (the recurrent product with
// the whole cell as its epilogue, c updated in place, h read from the previous step's output rows),
// and the final h copied.
TEST(GpuPlan, LstmIsOneRegionPerStep) {
  auto cell = frontend::loadCell("lstm");
  cell->bindSizes({{"input_size", 64}, {"hidden_size", 48}});
  std::ostringstream log;
  passes::runPipeline(*cell, {}, log);
  const codegen::StoragePlan plan = codegen::planStorage(*cell, codegen::gpuTarget("sm_80"));
  std::vector<std::string> described;
  for (const codegen::GpuRegion& region : codegen::planGpuRegions(*cell, plan))
    described.push_back(region.describe(*cell).substr(0, region.describe(*cell).find(' ')));
  EXPECT_EQ(described, (std::vector<std::string>{"params:", "params:", "pre:", "step:", "final:"}));
  int steps = 0;
  for (const codegen::GpuRegion& region : codegen::planGpuRegions(*cell, plan))
    if (region.phase == codegen::GpuPhase::Step) {
      ++steps;
      EXPECT_EQ(region.kind, codegen::GpuRegion::Kind::Product);
      // Block tiles of 16 rows by 16 columns (of each of the 4 gates) through shared memory:
      // 4 x 3 blocks at batch 64, each 4 groups of 64 threads splitting the depth.
      ASSERT_TRUE(region.packed->blockTiled);
      EXPECT_EQ(region.packed->tileRows, 16);
      EXPECT_EQ(region.packed->width, 16);
      EXPECT_EQ(region.packed->depthGroups, 4);
      EXPECT_EQ(region.items(100, 64), 4 * 3);
      EXPECT_EQ(region.blockThreads(), 4 * 64);
      EXPECT_EQ(region.threads(100, 64), 4 * 3 * 4 * 64);
      // On the tensor cores: a group's two warps each 1 x 4 MMA tiles (16 rows by 32 of the
      // 64 packed columns).
      EXPECT_TRUE(region.packed->tensorCores);
      EXPECT_EQ(region.packed->warpTileRows, 1);
      EXPECT_EQ(region.packed->warpTileColumns, 4);
    } else if (region.phase == codegen::GpuPhase::Pre) {
      // The input projection: 64 rows by 32 columns of each gate per block of 256 threads,
      // its 8 warps 2 down by 4 across, each 2 x 4 MMA tiles (32 rows by 32 packed columns):
      // 16 fragment loads for 8 tiles, the fewest of the ways to deal them.
      ASSERT_TRUE(region.packed && region.packed->blockTiled);
      EXPECT_EQ(region.items(100, 64), 100 * 64 / 64 * 2);
      EXPECT_EQ(region.threads(100, 64), 100 * 2 * 256);
      EXPECT_TRUE(region.packed->tensorCores);
      EXPECT_EQ(region.packed->warpTileRows, 2);
      EXPECT_EQ(region.packed->warpTileColumns, 4);
    }
  EXPECT_EQ(steps, 1);
  // Asked for FMAs, the same block tiles without the tensor cores.
  const codegen::StoragePlan fma =
      codegen::planStorage(*cell, codegen::gpuTarget("sm_80", /*tensorCores=*/false));
  for (const codegen::PackedProduct& packed : fma.packedProducts) {
    EXPECT_TRUE(packed.blockTiled);
    EXPECT_FALSE(packed.tensorCores);
  }
}

// From kGpuBlockTiledBatch rows a step's products run in block tiles; below, split-depth warps,
// below kGpuSplitDepthTileRows rows in one-row tiles (a batch of 1 in 4-row tiles computed
// every sum four times). The emulation tests run all three: batches 1 and 3 (EdgeLengths), 6
// and 7, 33.
TEST(GpuPlan, EachBatchRunsItsVariant) {
  auto cell = frontend::loadCell("lstm");
  cell->bindSizes({{"input_size", 64}, {"hidden_size", 48}});
  GpuCell::Options options;
  options.gpu = "sm_80";
  std::shared_ptr<GpuCell> gpu = GpuCell::compile(*cell, options);
  auto stepTileRows = [&](int64_t batch) {
    for (const codegen::GpuRegion& region : gpu->regionsFor(batch))
      if (region.phase == codegen::GpuPhase::Step &&
          region.kind == codegen::GpuRegion::Kind::Product)
        return region.rowsPerItem;
    return int64_t{0};
  };
  EXPECT_EQ(stepTileRows(1), 1);
  EXPECT_EQ(stepTileRows(codegen::kGpuSplitDepthTileRows - 1), 1);
  EXPECT_EQ(stepTileRows(codegen::kGpuSplitDepthTileRows), codegen::kGpuSplitDepthTileRows);
  EXPECT_EQ(stepTileRows(codegen::kGpuBlockTiledBatch - 1), codegen::kGpuSplitDepthTileRows);
  EXPECT_EQ(stepTileRows(codegen::kGpuBlockTiledBatch), 16);
  EXPECT_EQ(stepTileRows(64), 16);
  EXPECT_EQ(&gpu->regionsFor(64), &gpu->regions());
  EXPECT_NE(gpu->ptxFor(64).find("bar.sync"), std::string::npos);
  EXPECT_NE(gpu->ptxFor(64).find(".shared"), std::string::npos);
  // The block tiles' products on the tensor cores, each float split into two TF32s; asked for
  // FMAs, none.
  EXPECT_NE(gpu->ptxFor(64).find("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
            std::string::npos);
  EXPECT_NE(gpu->ptxFor(64).find("cvt.rna.tf32.f32"), std::string::npos);
  // Their kernels launched in blocks of 256 threads, two to a multiprocessor.
  EXPECT_NE(gpu->ptxFor(64).find(".maxntid 256, 1, 1\n.minnctapersm 2"), std::string::npos);
  options.tensorCores = false;
  EXPECT_EQ(GpuCell::compile(*cell, options)->ptxFor(64).find("mma.sync"), std::string::npos);
  // The persistent kernel's grid barrier: a releasing add and an acquiring spin, no full fence
  // (codegen/GpuEmitter.cpp: membar.gl cost 4-9% at batch 1).
  for (int64_t batch : {int64_t{1}, int64_t{64}}) {
    const std::string& ptx = gpu->ptxFor(batch);
    EXPECT_NE(ptx.find("red.release.gpu.add.u64"), std::string::npos) << batch;
    EXPECT_NE(ptx.find("ld.acquire.gpu.u64"), std::string::npos) << batch;
    EXPECT_EQ(ptx.find("membar.gl"), std::string::npos) << batch;
  }
}

// ptxas, the assembler the CUDA driver's JIT shares, accepts every cell's kernels.
class Ptxas : public test::ScratchDirTest {};

TEST_F(Ptxas, AcceptsEveryCellForSm80AndSm90) {
  if (!std::filesystem::exists(kPtxas))
    GTEST_SKIP() << kPtxas << " not found (the CUDA toolkit): PTX not assembled";
  std::vector<std::unique_ptr<ir::Cell>> cells = cellsUnderTest();
  cells.push_back(passes::deriveBackward(*frontend::loadCell("lnlstm")).cell);
#if defined(__SANITIZE_ADDRESS__)
  // The sanitizer build generates the same PTX text: one GPU there keeps CI quick.
  const std::vector<const char*> gpus = {"sm_80"};
#else
  const std::vector<const char*> gpus = {"sm_80", "sm_90"};
#endif
  for (const auto& source : cells)
    for (const char* sm : gpus) {
      SCOPED_TRACE(source->name + " " + sm);
      GpuCase c = makeCase(*source, 1, 1, 1);
      GpuCell::Options options;
      options.gpu = sm;
      std::shared_ptr<GpuCell> gpu = GpuCell::compile(*c.cell, options);
      // The kernels for batches of kGpuBlockTiledBatch rows and more, and (on the last GPU: the
      // same code but for the tiles' rows) the split-depth step tiles of smaller batches.
      std::vector<const std::string*> variants = {&gpu->ptx()};
      std::shared_ptr<GpuCell> fma;
      if (sm == gpus.back()) {
        variants.push_back(&gpu->ptxFor(codegen::kGpuSplitDepthTileRows));
        variants.push_back(&gpu->ptxFor(1));
        options.tensorCores = false; // and the block tiles in FMAs
        fma = GpuCell::compile(*c.cell, options);
        variants.push_back(&fma->ptx());
      }
      for (const std::string* text : variants) {
        EXPECT_NE(text->find(std::string(".target ") + sm), std::string::npos);
        const std::string ptx = writeBytes(source->name + "_" + sm + ".ptx", *text);
        const std::string command = std::string(kPtxas) + " -arch=" + sm + " " + ptx + " -o " +
                                    path("out.cubin") + " > " + path("ptxas.log") + " 2>&1";
        const int status = std::system(command.c_str());
        std::ifstream log(path("ptxas.log"));
        EXPECT_EQ(status, 0) << std::string(std::istreambuf_iterator<char>(log), {});
      }
    }
}

// Without a GPU, asking for one is a clear error; with one, the cells run on it as emulated.
TEST(CudaDevice, RunsCellsOrSaysWhyNot) {
  const std::string reason = CudaDriver::unavailableReason();
  auto lstm = frontend::loadCell("lstm");
  GpuCase c = makeCase(*lstm, 5, 7, 2);
  std::shared_ptr<GpuCell> gpu = GpuCell::compile(*c.cell, {});
  if (!reason.empty()) {
    EXPECT_THAT(reason, testing::AnyOf(testing::HasSubstr("CUDA"), testing::HasSubstr("GPU")));
    std::vector<Tensor> states = c.states;
    test::expectUserError([&] { gpu->run(c.params, c.inputs, states); }, {reason});
    GTEST_SKIP() << "no GPU here: " << reason;
  }
  // Batches of each variant: one-row and 4-row split-depth warps, block tiles.
  for (const auto& source : cellsUnderTest())
    for (int64_t batch : {int64_t{2}, int64_t{7}, codegen::kGpuBlockTiledBatch + 1}) {
      GpuCase k = makeCase(*source, 5, batch, 3);
      std::vector<Tensor> expectedStates = k.states;
      Tensor expected = Interpreter(*k.cell, k.params).run(k.inputs, expectedStates);
      GpuCell::Options fma;
      fma.tensorCores = false;
      std::shared_ptr<GpuCell> code = GpuCell::compile(*k.cell, {});
      std::shared_ptr<GpuCell> fmaCode = GpuCell::compile(*k.cell, fma);
      for (int way = 0; way < 3; ++way) {
        const GpuSchedule schedule = way == 0 ? GpuSchedule::PerStep : GpuSchedule::Persistent;
        const GpuCell& run = way == 2 ? *fmaCode : *code;
        SCOPED_TRACE(source->name + ", batch " + std::to_string(batch) +
                     (way == 1   ? ", persistent"
                      : way == 2 ? ", persistent, FMAs"
                                 : ""));
        std::vector<Tensor> states = k.states;
        Tensor output = run.run(k.params, k.inputs, states, schedule);
        EXPECT_LT(test::maxAbsDiff(output, expected), 1e-4);
        for (size_t s = 0; s < states.size(); ++s)
          EXPECT_LT(test::maxAbsDiff(states[s], expectedStates[s]), 1e-4);
      }
    }
}

} // namespace

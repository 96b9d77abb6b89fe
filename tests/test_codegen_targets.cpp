// The emitter's choices follow the target (vector width, registers, features), including for
// CPUs we do not run on: AVX-512 code is checked here as assembly, since no machine of ours has
// AVX-512.
#include "codegen/Compiler.h"
#include "codegen/HostTarget.h"
#include "codegen/ObjectBundle.h"
#include "codegen/StoragePlan.h"
#include "frontend/BuiltinCells.h"
#include "ir/Error.h"
#include "passes/PassManager.h"

#include <gtest/gtest.h>

#include <regex>
#include <sstream>

using namespace rnnc;

namespace {

std::unique_ptr<ir::Cell> optimisedLstm(int64_t hidden, int64_t input = 32) {
  auto cell = frontend::loadCell("lstm");
  cell->bindSizes({{"input_size", input}, {"hidden_size", hidden}});
  std::ostringstream log;
  passes::runPipeline(*cell, {}, log);
  return cell;
}

// An LSTM's code at `stage` for `target`, both parts.
std::string lstmCode(int64_t hidden, int64_t input, const codegen::Target& target,
                     codegen::Stage stage) {
  auto lstm = optimisedLstm(hidden, input);
  codegen::StoragePlan plan = codegen::planStorage(*lstm, target);
  return codegen::generate(*lstm, plan, target, stage);
}

int count(const std::string& text, const std::string& pattern) {
  std::regex re(pattern);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

const codegen::Target kAvx512{"x86_64-unknown-linux-gnu", "skylake-avx512",
                              "+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx2,+avx,+fma", 16, 32};
const codegen::Target kAvx2{"x86_64-unknown-linux-gnu", "znver3", "+avx2,+avx,+fma", 8, 16};

TEST(CodegenTargets, Avx512TilesAreZmmFmasWithTwiceTheRows) {
  auto lstm = optimisedLstm(64);
  codegen::StoragePlan plan = codegen::planStorage(*lstm, kAvx512);
  ASSERT_EQ(plan.packedProducts.size(), 2u); // the input projection, then the recurrent one
  EXPECT_EQ(plan.packedProducts[1].width, 16);
  EXPECT_EQ(plan.packedProducts[1].tileRows, 14); // 28 accumulators of 32 registers
  std::string assembly = codegen::generate(*lstm, plan, kAvx512, codegen::Stage::Assembly);
  // The full tile: 14 rows x 2 slices of FMAs per depth, on 16-float registers.
  EXPECT_GE(count(assembly, R"(vfmadd\d+ps\s+[^\n]*zmm)"), 28);
  EXPECT_EQ(count(assembly, R"(vfmadd\d+ps\s+[^\n]*ymm)"), 0);
}

TEST(CodegenTargets, Avx2TilesAreYmmFmas) {
  auto lstm = optimisedLstm(64);
  codegen::StoragePlan plan = codegen::planStorage(*lstm, kAvx2);
  EXPECT_EQ(plan.packedProducts.at(1).tileRows, 6);
  std::string assembly = codegen::generate(*lstm, plan, kAvx2, codegen::Stage::Assembly);
  EXPECT_GE(count(assembly, R"(vfmadd\d+ps\s+[^\n]*ymm)"), 12);
  EXPECT_EQ(count(assembly, "zmm"), 0);
}

// fp16 weights of single rows are widened half a zmm at a time on Zen 4, whose zmm vcvtph2ps
// takes twice as long per weight as its ymm one (ProductKernelEmitter::emitTile), and in whole
// zmm elsewhere. The single-row tile is in every recurrent product's code (batch 1, the rows
// left after the tiles).
TEST(CodegenTargets, Fp16SingleRowsWidenInHalvesOnlyOnZen4) {
  auto lstm = optimisedLstm(64);
  const codegen::Target zen4{"x86_64-unknown-linux-gnu", "znver4",
                             "+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx2,+avx,+fma,+f16c", 16,
                             32};
  codegen::Target skylake = kAvx512;
  skylake.features += ",+f16c";
  for (const codegen::Target& target : {zen4, skylake}) {
    codegen::StoragePlan plan = codegen::planStorage(*lstm, target, codegen::WeightType::F16);
    const std::string assembly = codegen::generate(*lstm, plan, target, codegen::Stage::Assembly);
    EXPECT_GE(count(assembly, R"(vcvtph2ps\s+[^\n]*zmm)"), 1) << target.cpu;
    if (target.cpu == "znver4") {
      EXPECT_GE(count(assembly, R"(vcvtph2ps\s+[^\n]*ymm)"), 4) << target.cpu;
      EXPECT_GE(count(assembly, R"(vfmadd\d+ps\s+[^\n]*ymm)"), 4) << target.cpu;
    } else {
      EXPECT_EQ(count(assembly, R"(vcvtph2ps\s+[^\n]*ymm)"), 0) << target.cpu;
    }
  }
}

// A cell's code is two modules compiled side by side: the loop part (rnnc_run: a call of the
// setup part, then the time loop) and the setup part (rnnc_run.setup: the parameter and pre
// phases), which also defines the walks over the depth of the full tiles (rnnc_walk.*), the
// recurrent product's included, which the loop calls. The object is a bundle of both, the setup
// part first; the single-row tiles stay in the part that uses them.
TEST(CodegenTargets, ACellIsALoopPartCallingASetupPartThatHoldsTheTileWalks) {
  auto lstm = optimisedLstm(64);
  codegen::StoragePlan plan = codegen::planStorage(*lstm, kAvx2);
  const std::string object = codegen::generate(*lstm, plan, kAvx2, codegen::Stage::Object);
  ASSERT_TRUE(codegen::isObjectBundle(object));
  EXPECT_EQ(codegen::objectsOfBundle(object).size(), 2u);
  const std::string assembly = codegen::generate(*lstm, plan, kAvx2, codegen::Stage::Assembly);
  const size_t setup = assembly.find("\nrnnc_run.setup:"), loop = assembly.find("\nrnnc_run:");
  ASSERT_NE(setup, std::string::npos);
  ASSERT_NE(loop, std::string::npos);
  EXPECT_GT(loop, setup);
  const std::string setupPart = assembly.substr(0, loop), loopPart = assembly.substr(loop);
  EXPECT_EQ(count(loopPart, R"(call[q]?\s+rnnc_run\.setup\b)"), 1);
  // I = 32 and H = 64: the input projection and the recurrent product walk different depths,
  // and one walk, in the setup part, serves both (its depth an argument, their rows of x as far
  // apart), called by each part.
  EXPECT_EQ(count(setupPart, R"(\nrnnc_walk\.[\w.]+:)"), 1);
  EXPECT_EQ(count(loopPart, R"(\nrnnc_walk\.[\w.]+:)"), 0);
  EXPECT_GE(count(loopPart, R"(call[q]?\s+rnnc_walk\.)"), 1);
  EXPECT_GE(count(setupPart, R"(call[q]?\s+rnnc_walk\.)"), 1);
  // The walks' FMAs (AVX2's LSTM has four gates of one vector each, two per pass for the
  // tiles), and the single rows' in each part (all four gates at once).
  EXPECT_GE(count(setupPart, R"(vfmadd\d+ps\s+[^\n]*ymm)"), 24);
  EXPECT_GE(count(loopPart, R"(vfmadd\d+ps\s+[^\n]*ymm)"), 4);
}

// Walks of the same shape are one function: an LSTM's input projection (one slice two
// registers wide) and its recurrent product (two gates a pass, a register each) with I = H
// walk the same weights' layout over the same depth, so the setup part defines one walk that
// both call, and the loop part only declares it.
TEST(CodegenTargets, WalksOfTheSameShapeAreOneFunction) {
  const std::string ir = lstmCode(64, 64, kAvx512, codegen::Stage::LLVM);
  EXPECT_EQ(count(ir, R"(\ndefine [^\n]*@rnnc_walk\.)"), 1);
  EXPECT_EQ(count(ir, R"(\ndeclare [^\n]*@rnnc_walk\.)"), 1);
  const size_t loop = ir.find("\ndefine void @rnnc_run(");
  ASSERT_NE(loop, std::string::npos);
  EXPECT_GE(count(ir.substr(0, loop), R"(call void @rnnc_walk\.)"), 1);
  EXPECT_GE(count(ir.substr(loop), R"(call void @rnnc_walk\.)"), 1);
}

// A walk over the depth takes the depth as an argument: an LSTM with I != H (within a factor of
// two) has one walk that both products call with their own depths, rows of x as far apart, and
// that asks for next panels (W_hh past L2) for both where the input projection's weights need
// none (W_ih, 2 MB, within it).
TEST(CodegenTargets, ProductsOfDifferentDepthsShareOneWalk) {
  for (codegen::Target target : {kAvx512, kAvx2}) {
    target.l2Bytes = 2 << 20; // W_hh 4 MB past it, W_ih 2 MB not
    const std::string ir = lstmCode(/*hidden=*/512, /*input=*/256, target, codegen::Stage::LLVM);
    const std::regex defined(R"(\ndefine [^\n]*@(rnnc_walk\.[\w.]+)\()");
    std::vector<std::string> walks;
    for (auto it = std::sregex_iterator(ir.begin(), ir.end(), defined);
         it != std::sregex_iterator(); ++it)
      walks.push_back((*it)[1].str());
    const bool shared = target.vectorRegisters > 16;
    ASSERT_EQ(walks.size(), shared ? 1u : 2u) << target.cpu;
    for (const std::string& walk : walks) {
      EXPECT_NE(walk.find(".kNc1."), std::string::npos) << walk;
      EXPECT_NE(walk.find(".x528."), std::string::npos) << walk; // 512 + 16, both products
    }
    // The depths the calls pass, the last argument but the panel width: 256 (x) and 512 (h).
    EXPECT_GE(count(ir, R"(call void @rnnc_walk\.[^\n]*, i64 256, i64 \d+\))"), 1) << target.cpu;
    EXPECT_GE(count(ir, R"(call void @rnnc_walk\.[^\n]*, i64 512, i64 \d+\))"), 1) << target.cpu;
  }
}

// A walk that asks for next panels serves a tile of its shape that has none to ask for, with 32
// registers: an LSTM with a projection at I = H has the input projection's walk (W_ih past this
// target's 512 KB of L2) and the projection's (within; its block over the depth of 384 outgrows
// L1, so its tile is the input projection's, 14 x 32, AVX2's 6 x 16) of one shape, so the setup
// part defines
// two walks (that one, and the recurrent product's over P), not three, and the loop part declares
// them alike (a definition missing in the setup part would fail the link at load). AVX2's
// walks keep the two apart: their few FMAs a step have no issue slots to spare for the
// prefetch's instructions.
TEST(CodegenTargets, ATileWithinL2TakesTheWalkOfItsShapeThatPrefetches) {
  auto lstmProj = frontend::loadCell("lstm_proj");
  lstmProj->bindSizes({{"input_size", 384}, {"hidden_size", 384}, {"proj_size", 32}});
  std::ostringstream log;
  passes::runPipeline(*lstmProj, {}, log);
  for (codegen::Target target : {kAvx512, kAvx2}) {
    target.l2Bytes = 512 << 10; // W_ih 2.3 MB past it; W_hh 192 KB and W_hr 48 KB within
    codegen::StoragePlan plan = codegen::planStorage(*lstmProj, target);
    const std::string ir = codegen::generate(*lstmProj, plan, target, codegen::Stage::LLVM);
    const size_t loop = ir.find("\ndefine void @rnnc_run(");
    ASSERT_NE(loop, std::string::npos);
    const std::string setupPart = ir.substr(0, loop), loopPart = ir.substr(loop);
    const bool shared = target.vectorRegisters > 16;
    EXPECT_EQ(count(setupPart, R"(\ndefine [^\n]*@rnnc_walk\.[\w.]+_p\d+\()"), 1) << target.cpu;
    EXPECT_EQ(count(setupPart, R"(\ndefine [^\n]*@rnnc_walk\.)"), shared ? 2 : 3) << target.cpu;
    // Every walk the loop calls is one the setup part defines.
    std::smatch call;
    const std::regex called(R"(call void @(rnnc_walk\.[\w.]+)\()");
    int calls = 0;
    for (auto it = std::sregex_iterator(loopPart.begin(), loopPart.end(), called);
         it != std::sregex_iterator(); ++it, ++calls)
      EXPECT_NE(setupPart.find("define void @" + (*it)[1].str() + "("), std::string::npos)
          << (*it)[1].str() << " on " << target.cpu;
    EXPECT_GE(calls, 2) << target.cpu;
  }
}

// An LSTM's full tiles take their four gates in two passes of two, alike: one walk over the
// depth in a loop over the passes (emitTile), not a walk per pass. The tiles of every height
// from 7 to 14 rows are one walk (each row past the 7th entered below the run-time height,
// found by comparisons from the full height down; the input projection's padded tiles call it
// at full height), shared by the two products at I = H, and each part's single rows one more:
// three walks, where a variant per height made seven.
TEST(CodegenTargets, AlikePassesOfATileAreOneLoopAndHeightsOneWalk) {
  const std::string ir = lstmCode(64, 64, kAvx512, codegen::Stage::LLVM);
  EXPECT_GE(count(ir, R"(\npass\.header\d*:)"), 1);
  EXPECT_EQ(count(ir, R"(\ndepth\d*:)"), 3);
  // Rows 8 to 14, each a block entered from a comparison with the height or from the row above
  // it; six comparisons past the first (heights 13 down to 8).
  EXPECT_EQ(count(ir, R"(\nrow\d+:)"), 7);
  EXPECT_EQ(count(ir, R"(\nbelow\d+:)"), 6);
}

} // namespace

// Weights past L2 come from L3 or memory a block at a time: the tiles of each block ask for the
// next block's panel (prefetcht1, a line per depth step) so that its first tile does not wait on
// it; weights that L2 holds are not asked for again.
TEST(CodegenTargets, TilesPrefetchTheNextPanelOnlyWhenWeightsOutgrowL2) {
  for (const codegen::Target& target : {kAvx512, kAvx2}) {
    auto big = optimisedLstm(512); // W_hh packed: 4 MB
    codegen::StoragePlan bigPlan = codegen::planStorage(*big, target);
    std::string assembly = codegen::generate(*big, bigPlan, target, codegen::Stage::Assembly);
    EXPECT_GE(count(assembly, R"(prefetcht1\s)"), 1) << target.cpu;
    auto small = optimisedLstm(64); // 64 KB
    codegen::StoragePlan smallPlan = codegen::planStorage(*small, target);
    assembly = codegen::generate(*small, smallPlan, target, codegen::Stage::Assembly);
    EXPECT_EQ(count(assembly, R"(prefetcht1\s)"), 0) << target.cpu;
  }
}

// What the compiler library throws reaches the caller as the same kind with the same message:
// the library catches it at its boundary and the caller throws its like again, since the rnnc
// tool's own unwinder could not catch it (codegen/CompilerLibrary.h). The tool's side is
// ToolErrorTest.CompileForAnUnknownCpuListsTheKnownOnes.
TEST(CodegenTargets, ErrorsOfTheCompilerLibraryComeBackAsTheirKind) {
  try {
    codegen::namedX86Target("no-such-cpu");
    ADD_FAILURE() << "an unknown CPU was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown x86-64 CPU 'no-such-cpu'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("znver4"), std::string::npos) << e.what();
  }
  try {
    codegen::generateGemmTile(codegen::gpuTarget("sm_90"), codegen::Stage::Assembly);
    ADD_FAILURE() << "the CPU's GEMM tile was generated for a GPU";
  } catch (const InternalError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("internal error: ", 0), 0u) << message;
    EXPECT_EQ(count(message, "internal error"), 1) << message;
    EXPECT_NE(message.find("the runtime GEMM runs on the CPU"), std::string::npos) << message;
  }
}

// LLVM's optimiser does its work on our code (codegen/OptimisationPipeline.cpp): on the CPU, loads
// and address arithmetic merged or hoisted out of the kernels' loops; on the GPU, stack slots
// promoted to registers, the regions inlined into their kernels and dropped, and the address
// spaces the emitter states carried to the loads and stores.
TEST(CodegenTargets, TheOptimiserMergesTheCpusLoadsAndInlinesTheGpusRegions) {
  const std::string cpu = lstmCode(32, 32, kAvx2, codegen::Stage::LLVM);
  const std::string cpuOptimised = lstmCode(32, 32, kAvx2, codegen::Stage::OptimisedLLVM);
  EXPECT_LT(count(cpuOptimised, " = load "), count(cpu, " = load "));
  EXPECT_LT(count(cpuOptimised, "getelementptr"), count(cpu, "getelementptr"));

  const codegen::Target gpu = codegen::gpuTarget("sm_80");
  auto lstm = optimisedLstm(32, 32);
  const codegen::StoragePlan plan = codegen::planStorage(*lstm, gpu);
  const std::string kernels = codegen::generateGpu(*lstm, plan, gpu, codegen::Stage::LLVM);
  const std::string optimised =
      codegen::generateGpu(*lstm, plan, gpu, codegen::Stage::OptimisedLLVM);
  EXPECT_GT(count(kernels, " alloca "), 0);
  EXPECT_EQ(count(optimised, " alloca "), 0);
  EXPECT_GT(count(kernels, "define internal"), 0);
  EXPECT_EQ(count(optimised, "define internal"), 0);
  EXPECT_GT(count(optimised, "define void @rnnc_kernel_"), 0);
  EXPECT_LT(count(optimised, "addrspacecast"), count(kernels, "addrspacecast") / 2);
}

// The emitter's choices follow the target (vector width, registers, features), including for
// CPUs we do not run on: AVX-512 code is checked here as assembly, since no machine of ours has
// AVX-512.
#include "codegen/Compiler.h"
#include "codegen/ObjectBundle.h"
#include "codegen/StoragePlan.h"
#include "frontend/BuiltinCells.h"
#include "passes/PassManager.h"

#include <gtest/gtest.h>

#include <regex>
#include <sstream>

using namespace rnnc;

namespace {

std::unique_ptr<ir::Cell> optimisedLstm(int64_t hidden) {
  auto cell = frontend::loadCell("lstm");
  cell->bindSizes({{"input_size", 32}, {"hidden_size", hidden}});
  std::ostringstream log;
  passes::runPipeline(*cell, {}, log);
  return cell;
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

// A cell's code is three modules compiled side by side: the setup part (rnnc_run: the parameter
// and pre phases), the time loop (rnnc_run.loop), which the setup part calls, and the recurrent
// product's single-row tile (rnnc_run.loop.tileN), which the loop calls. The object is a bundle
// of all three, each part after those it calls; the tile of every other height stays in the loop.
TEST(CodegenTargets, ACellIsASetupPartCallingALoopPartCallingItsSingleRowTile) {
  auto lstm = optimisedLstm(64);
  codegen::StoragePlan plan = codegen::planStorage(*lstm, kAvx2);
  const std::string object = codegen::generate(*lstm, plan, kAvx2, codegen::Stage::Object);
  ASSERT_TRUE(codegen::isObjectBundle(object));
  EXPECT_EQ(codegen::objectsOfBundle(object).size(), 3u);
  const std::string assembly = codegen::generate(*lstm, plan, kAvx2, codegen::Stage::Assembly);
  const size_t setup = assembly.find("\nrnnc_run:"), loop = assembly.find("\nrnnc_run.loop:"),
               tiles = assembly.find("\nrnnc_run.loop.tile0:");
  ASSERT_NE(setup, std::string::npos);
  ASSERT_NE(loop, std::string::npos);
  ASSERT_NE(tiles, std::string::npos);
  EXPECT_GT(loop, setup);
  EXPECT_GT(tiles, loop);
  EXPECT_EQ(count(assembly.substr(0, loop), R"(call[q]?\s+rnnc_run\.loop\b)"), 1);
  // The step's barrier is in the loop part; all parts have tiles (the input projection's, the
  // recurrent product's of 3 to 6 rows, and its single row's: AVX2's LSTM has four gates of one
  // vector each, two per pass for the tiles, all four for a single row).
  const std::string loopPart = assembly.substr(loop, tiles - loop);
  const std::string tilesPart = assembly.substr(tiles);
  EXPECT_GE(count(loopPart, R"(vfmadd\d+ps\s+[^\n]*ymm)"), 12);
  EXPECT_GE(count(assembly.substr(0, loop), R"(vfmadd\d+ps\s+[^\n]*ymm)"), 12);
  EXPECT_GE(count(tilesPart, R"(vfmadd\d+ps\s+[^\n]*ymm)"), 4);
  EXPECT_EQ(count(tilesPart, R"(\nrnnc_run\.loop\.tile\d+:)"), 1);
  EXPECT_GE(count(loopPart, R"(call[q]?\s+rnnc_run\.loop\.tile\d+)"), 1);
  EXPECT_EQ(tilesPart.find("\nrnnc_run.loop:"), std::string::npos);
}

// An LSTM's full tiles take their four gates in two passes of two, alike: one walk over the
// depth in a loop over the passes (emitTile), not a walk per pass. The recurrent product's
// tiles of every height from 7 to 14 rows are one walk (each row past the 7th entered below the
// run-time height, found by comparisons from the full height down), its single rows another,
// and the input projection's two variants two more: four walks, where a variant per height
// made seven.
TEST(CodegenTargets, AlikePassesOfATileAreOneLoopAndHeightsOneWalk) {
  auto lstm = optimisedLstm(64);
  codegen::StoragePlan plan = codegen::planStorage(*lstm, kAvx512);
  const std::string ir = codegen::generate(*lstm, plan, kAvx512, codegen::Stage::LLVM);
  EXPECT_GE(count(ir, R"(\npass\.header\d*:)"), 1);
  EXPECT_EQ(count(ir, R"(\ndepth\d*:)"), 4);
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

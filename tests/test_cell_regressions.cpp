// Cells that once stopped with an internal error in some pass setting while the interpreter ran
// them (issue 13's reproductions), and every built-in cell, run by the JIT under every pass
// setting, on 1 and 2 threads, against the interpreter.
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "passes/Autodiff.h"
#include "passes/PassManager.h"
#include "tests/PassSettings.h"
#include "tests/RegressionCells.h"
#include "tests/RunSequence.h"
#include "tests/TestSupport.h"

#include <gtest/gtest.h>

#include <random>

using namespace rnnc;

namespace {

// Runs `cell` on random weights, inputs and initial states under every setting and thread count,
// against the interpreter.
void expectEverySettingMatchesTheInterpreter(const ir::Cell& cell) {
  std::mt19937 rng(3);
  const ir::SizeMap all = {{"input_size", 5}, {"hidden_size", 9}, {"proj_size", 4}};
  ir::SizeMap sizes;
  for (const std::string& name : cell.sizeNames)
    sizes[name] = all.at(name);
  TensorMap weights = test::randomWeights(cell, sizes, rng);
  SequenceRequest request;
  request.weights = &weights;
  request.sizes = sizes;
  for (const auto& input : cell.inputs)
    request.inputs[input->name] =
        test::randomTensor({4, 3, *input->shape[1].evaluate(sizes)}, rng, 1.0f);
  for (const auto& state : cell.states)
    request.initialStates[state->name] =
        test::randomTensor({1, 3, *state->shape[1].evaluate(sizes)}, rng);
  request.engine = Engine::Interpreter;
  SequenceResult expected = runSequence(cell, request);
  request.engine = Engine::Jit; // the disk cache (the tests' own) spares the second thread count
  for (const test::PassSetting& setting : test::everyPassSetting())
    for (int threads : {1, 2}) {
      SCOPED_TRACE(cell.name + ", " + setting.name + ", " + std::to_string(threads) + " threads");
      request.compile.pipeline = setting.pipeline;
      request.threads = threads;
      SequenceResult actual = runSequence(cell, request);
      ASSERT_EQ(actual.engine, Engine::Jit);
      EXPECT_LT(test::maxAbsDiff(actual.output, expected.output), 1e-5);
      for (const auto& [name, state] : expected.finalStates)
        EXPECT_LT(test::maxAbsDiff(actual.finalStates.at(name), state), 1e-5) << name;
    }
}

TEST(CellRegressions, ReproductionsRunUnderEveryPassSetting) {
  for (const auto& [name, source] : test::kRegressionCells)
    expectEverySettingMatchesTheInterpreter(
        *frontend::parseCell(source, std::string(name) + ".cell"));
}

// The cells in cells/ (the README's LSTM among them).
TEST(CellRegressions, EveryBuiltinCellRunsUnderEveryPassSetting) {
  for (const std::string& name : frontend::builtinCellNames())
    expectEverySettingMatchesTheInterpreter(*frontend::loadCell(name));
}

} // namespace

namespace {

// The backward step of every built-in cell (passes/Autodiff.h) is a cell like any other: the JIT
// runs it under every pass setting as the interpreter does.
TEST(CellRegressions, EveryBuiltinCellsBackwardRunsUnderEveryPassSetting) {
  for (const std::string& name : frontend::builtinCellNames())
    expectEverySettingMatchesTheInterpreter(
        *passes::deriveBackward(*frontend::loadCell(name)).cell);
}

} // namespace

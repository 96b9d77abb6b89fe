// The JIT against the reference interpreter: every built-in cell and several custom ones, over
// sizes including the odd ones (hidden 1, 3, 17, 400, 1000; batch 1, 5, 64, 250; T 1 and 100;
// batches of many tiles, half tiles and single rows), on one thread and on several.
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "runtime/exec/CompiledCell.h"
#include "runtime/exec/Interpreter.h"
#include "tests/RunSequence.h"
#include "tests/RunnableCpus.h"
#include "tests/TestSupport.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace rnnc;

namespace {

// Every op the language has, including ones that need care in generated code: NaN-propagating
// min/max, log and sqrt of positive values, concat feeding a product, a state swap.
const char* kEverything = R"(cell everything(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size], c[hidden_size]
  param w[hidden_size, input_size + hidden_size], u[hidden_size, hidden_size]
  param v[hidden_size], g[hidden_size]
  z = cat(x, h) @ w^T
  a = max(z, c) - min(z, 0.5) / 2 + clamp(z, -0.3, 0.4) * relu(-z)
  b = exp(-z) * sqrt(z * z + 1) + log(1 + z * z) + (h @ u) * v
  return h = tanh(a + b), c = layernorm(h + c, g, v, eps=0.01); output tanh(sigmoid(a) - b)
})";

// An output that concatenates what the step computes (stored straight into its columns of the
// output, codegen::StoragePlan::inOutputColumns), a state as it entered the step (copied) and
// one value twice (copied), as a training forward's output is.
const char* kConcatOutput = R"(cell concat_output(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size], c[hidden_size]
  param w[2*hidden_size, input_size], u[2*hidden_size, hidden_size]
  f, i = chunk(x @ w^T + h @ u^T, 2)
  gf = sigmoid(f)
  gi = tanh(i)
  c2 = gf * c + gi
  h2 = tanh(c2)
  return h = h2, c = c2; output cat(h2, c, gf, gi, gi)
})";

// `cell` compiled for `cpu` (LLVM's name), nothing taken from or kept in the disk cache.
std::shared_ptr<CompiledCell> compileFor(const ir::Cell& cell, const std::string& cpu) {
  CompileOptions options;
  options.targetCpu = cpu;
  options.cache.disk = false;
  return CompiledCell::compile(cell, options);
}

// Three steps of `batch` random rows from random states through `compiled` and through the
// interpreter: the output and every final state within 1e-5 (`where` names the case).
void expectThreeStepsMatchTheInterpreter(const ir::Cell& cell, const std::vector<Tensor>& params,
                                         const CompiledCell& compiled, int64_t batch, int64_t input,
                                         int64_t hidden, std::mt19937& rng,
                                         const std::string& where) {
  std::vector<Tensor> inputs = {test::randomTensor({3, batch, input}, rng)};
  std::vector<Tensor> states;
  for (size_t s = 0; s < cell.states.size(); ++s)
    states.push_back(test::randomTensor({batch, hidden}, rng));
  std::vector<Tensor> expectedStates = states;
  Tensor expected = Interpreter(cell, params).run(inputs, expectedStates);
  Tensor actual = compiled.run(params, inputs, states);
  EXPECT_LT(test::maxAbsDiff(actual, expected), 1e-5) << where;
  for (size_t i = 0; i < states.size(); ++i)
    EXPECT_LT(test::maxAbsDiff(states[i], expectedStates[i]), 1e-5) << where << " state " << i;
}

struct JitCase {
  std::string name, source;
};

void PrintTo(const JitCase& c, std::ostream* os) {
  *os << c.name;
}

class JitMatchesInterpreter : public testing::TestWithParam<JitCase> {};

TEST_P(JitMatchesInterpreter, OnOddAndTypicalSizes) {
  const JitCase& param = GetParam();
  auto cell = param.source.empty() ? frontend::loadCell(param.name)
                                   : frontend::parseCell(param.source, param.name + ".cell");
  std::mt19937 rng(7);
  struct Size {
    int64_t steps, batch, input, hidden;
  };
  for (int threads : {1, 3})
    for (Size s : {Size{1, 1, 1, 1}, Size{100, 5, 3, 3}, Size{7, 64, 5, 17}, Size{2, 5, 7, 1000},
                   Size{2, 250, 3, 400}}) {
      ir::SizeMap sizes = {{"input_size", s.input},
                           {"hidden_size", s.hidden},
                           {"proj_size", std::max<int64_t>(1, s.hidden / 2)},
                           {"B", s.batch}};
      TensorMap weights = test::randomWeights(*cell, sizes, rng);
      SequenceRequest request;
      request.weights = &weights;
      request.inputs["x"] = test::randomTensor({s.steps, s.batch, s.input}, rng);
      for (const auto& st : cell->states)
        request.initialStates[st->name] =
            test::randomTensor({1, s.batch, *st->shape[1].evaluate(sizes)}, rng);
      request.engine = Engine::Interpreter;
      SequenceResult expected = runSequence(*cell, request);
      request.engine = Engine::Jit;
      // One thread, and three on this 2-core machine: splits that do not divide the batch or the
      // column blocks evenly, some threads with nothing to do, and barriers that must sleep.
      request.threads = threads;
      SequenceResult actual = runSequence(*cell, request);
      ASSERT_EQ(actual.engine, Engine::Jit);
      std::string where = "T=" + std::to_string(s.steps) + " B=" + std::to_string(s.batch) +
                          " I=" + std::to_string(s.input) + " H=" + std::to_string(s.hidden) +
                          ", " + std::to_string(threads) + " threads";
      ASSERT_EQ(actual.output.shape(), expected.output.shape()) << where;
      for (int64_t i = 0; i < expected.output.numel(); ++i)
        ASSERT_NEAR(actual.output.data()[i], expected.output.data()[i], 1e-5)
            << where << " output element " << i;
      for (const auto& [name, state] : expected.finalStates)
        for (int64_t i = 0; i < state.numel(); ++i)
          ASSERT_NEAR(actual.finalStates.at(name).data()[i], state.data()[i], 1e-5)
              << where << " final " << name << " element " << i;
    }
}

// Every batch from 1 to 40 through one compiled cell (the batch is a run-time size), on the AVX2
// (haswell) and the host's code: the fused product splits the rows into tiles of the full height
// and one or two rows fewer where that balances, otherwise full tiles and the rest; a tile from
// half height on is the full tile's code with a run-time height (codegen/TileRows.h), smaller
// ones single rows (AVX2 LSTM: 6 to 3 rows, then single rows; AVX-512: 14 to 7; the vanilla
// RNN's 4-vector blocks, tiles of 2 or 3 rows, keep a variant per height; 40 rows reach every
// mix of them). H=11 leaves a partial column block; H=37 a full 32-column block of the RNN and
// a partial one; at H=300 the RNN's AVX2 blocks over the depth outgrow L1 and are 2 vectors
// wide, the SGEMM tile's 6 x 16 (codegen/StoragePlan.cpp), 18 full and a partial one.
TEST(JitTileHeights, EveryBatchFromOneToFortyMatchesTheInterpreter) {
  struct Case {
    const char* cell;
    int64_t hidden;
  };
  for (Case c : {Case{"lstm", 11}, Case{"gru", 11}, Case{"rnn_tanh", 37}, Case{"rnn_tanh", 300}}) {
    const char* name = c.cell;
    const int64_t hidden = c.hidden;
    auto cell = frontend::loadCell(name);
    cell->bindSizes({{"input_size", 4}, {"hidden_size", hidden}});
    std::mt19937 rng(11);
    std::vector<Tensor> params = test::randomParams(*cell, cell->sizes, rng);
    for (const std::string& cpu : test::runnableCpus()) {
      CompileOptions options;
      options.targetCpu = cpu;
      auto compiled = CompiledCell::compile(*cell, options);
      for (int64_t batch = 1; batch <= 40; ++batch)
        expectThreeStepsMatchTheInterpreter(
            *cell, params, *compiled, batch, /*input=*/4, hidden, rng,
            std::string(name) + " B=" + std::to_string(batch) + " " + cpu);
    }
  }
}

// A recurrent product of five gates keeps them in one panel (codegen/StoragePlan.cpp): a single
// row reads all five in one pass, full tiles two, two and one a pass, each pass a stride of the
// panel's depth rows, and the passes unlike (the last one slice), so each walks on its own. H=13
// leaves a partial column block; every batch from 1 to 20 reaches single rows, run-time heights
// and full tiles on AVX2's code and the host's.
TEST(JitTileHeights, FiveGatesInOnePanelMatchTheInterpreterAtEveryBatch) {
  auto cell = frontend::parseCell(R"(cell five(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size], c[hidden_size]
  param w[5*hidden_size, input_size], u[5*hidden_size, hidden_size], b[5*hidden_size]
  i, f, g, o, p = chunk(x @ w^T + h @ u^T + b, 5)
  c2 = sigmoid(f) * c + sigmoid(i) * tanh(g) + 0.5 * tanh(p)
  h2 = sigmoid(o) * tanh(c2)
  return h = h2, c = c2; output h2
})",
                                  "five.cell");
  const int64_t input = 6, hidden = 13;
  cell->bindSizes({{"input_size", input}, {"hidden_size", hidden}});
  std::mt19937 rng(13);
  std::vector<Tensor> params = test::randomParams(*cell, cell->sizes, rng);
  for (const std::string& cpu : test::runnableCpus()) {
    auto compiled = compileFor(*cell, cpu);
    bool onePanel = false;
    for (const codegen::PackedProduct& packed : compiled->plan().packedProducts)
      onePanel |= !packed.splitRows && packed.slices() == 5 && packed.panelSlices == 5;
    EXPECT_TRUE(onePanel) << cpu;
    for (int64_t batch = 1; batch <= 20; ++batch)
      expectThreeStepsMatchTheInterpreter(*cell, params, *compiled, batch, input, hidden, rng,
                                          "B=" + std::to_string(batch) + " " + cpu);
  }
}

// An LSTM with a projection at its fastrnns-like size: its input projection's weights (4 MB)
// outgrow L2 on every host and the projection's (0.5 MB) fit, and with 32 registers the
// projection's tiles take the input projection's walk, which asks for next panels, pointed at
// their own weights (codegen/ProductKernelEmitter.cpp). A few steps at a ragged batch (tiles of
// 14 and of a run-time height), on the host's code and AVX2's, against the interpreter.
TEST(JitSharedWalks, AProjectionTakingThePrefetchingWalkMatchesTheInterpreter) {
  auto cell = frontend::loadCell("lstm_proj");
  cell->bindSizes({{"input_size", 512}, {"hidden_size", 512}, {"proj_size", 256}});
  std::mt19937 rng(17);
  std::vector<Tensor> params = test::randomParams(*cell, cell->sizes, rng);
  const int64_t batch = 23;
  std::vector<Tensor> inputs = {test::randomTensor({2, batch, 512}, rng)};
  std::vector<Tensor> states = {test::randomTensor({batch, 256}, rng),
                                test::randomTensor({batch, 512}, rng)};
  std::vector<Tensor> expectedStates = states;
  Tensor expected = Interpreter(*cell, params).run(inputs, expectedStates);
  for (const std::string& cpu : test::runnableCpus()) {
    std::vector<Tensor> actualStates = states;
    Tensor actual = compileFor(*cell, cpu)->run(params, inputs, actualStates);
    EXPECT_LT(test::maxAbsDiff(actual, expected), 1e-4) << cpu;
    for (size_t i = 0; i < states.size(); ++i)
      EXPECT_LT(test::maxAbsDiff(actualStates[i], expectedStates[i]), 1e-4) << cpu << " " << i;
  }
}

// The concat output's parts stored in their columns by the kernels, on the AVX2 (haswell) and
// the host's AVX-512 code, 1 and 2 threads, a batch of one row and a ragged one.
// The concat output, and the same with h2 in later columns: the next step reads h from the
// output rows where h2 lies, with their stride (codegen::StoragePlan::readFromOutputColumn);
// and concats within the output that share parts, as a GRU's backward's [dgates_x | dgates_h]
// do (each part stored at its first place, copied to the other; c's next value read from the
// output's columns).
TEST(JitConcatOutput, MatchesTheInterpreterOnEveryTarget) {
  std::string later = kConcatOutput;
  later.replace(later.find("cat(h2, c, gf, gi, gi)"), 22, "cat(gf, gi, h2, c, gi)");
  std::string nested = kConcatOutput;
  nested.replace(nested.find("cat(h2, c, gf, gi, gi)"), 22,
                 "cat(cat(gf, gi, h2), cat(gf, gi, c2))");
  for (const std::string& source : {std::string(kConcatOutput), later, nested}) {
    SCOPED_TRACE(source.substr(source.find("output")));
    auto cell = frontend::parseCell(source, "concat_output.cell");
    const int64_t input = 7, hidden = 11, steps = 5;
    cell->bindSizes({{"input_size", input}, {"hidden_size", hidden}});
    std::mt19937 rng(5);
    std::vector<Tensor> params = test::randomParams(*cell, cell->sizes, rng);
    for (const std::string& cpu : test::runnableCpus()) {
      auto compiled = compileFor(*cell, cpu);
      for (int64_t batch : {1, 13})
        for (int threads : {1, 2}) {
          std::vector<Tensor> inputs = {test::randomTensor({steps, batch, input}, rng)};
          std::vector<Tensor> states, expectedStates;
          for (size_t s = 0; s < cell->states.size(); ++s)
            states.push_back(test::randomTensor({batch, hidden}, rng));
          expectedStates = states;
          Tensor expected = Interpreter(*cell, params).run(inputs, expectedStates);
          Tensor actual;
          CompiledCell::Workspace workspace;
          compiled->run(params, inputs, states, actual, workspace, threads);
          const std::string where =
              cpu + " B=" + std::to_string(batch) + " on " + std::to_string(threads) + " threads";
          EXPECT_LT(test::maxAbsDiff(actual, expected), 1e-5) << where;
          for (size_t i = 0; i < states.size(); ++i)
            EXPECT_LT(test::maxAbsDiff(states[i], expectedStates[i]), 1e-5) << where;
        }
    }
  }
}

// A row's result must not depend on how many threads computed it: an automatic run picks its
// thread count from the machine's load (runtime/threads/ThreadGovernor.h), so the same call would
// otherwise give different bits from one run to the next. Threads take whole tiles of the input
// GEMM (codegen/TileRows.h, tileUnits): a tile's height decides how its depth is summed.
// Bitwise, on AVX2 and AVX-512 code, for batches of one tile, several and a ragged rest, and
// for padded and packed (variable length) runs.
TEST(JitThreads, ResultsAreTheSameBitsOnAnyThreadCount) {
  for (const std::string& cpu : test::runnableCpus())
    for (const char* name : {"lstm", "gru", "rnn_tanh"}) {
      auto cell = frontend::loadCell(name);
      const int64_t input = 20, hidden = 37, steps = 6;
      cell->bindSizes({{"input_size", input}, {"hidden_size", hidden}});
      CompileOptions options;
      options.targetCpu = cpu;
      auto compiled = CompiledCell::compile(*cell, options);
      std::mt19937 rng(3);
      std::vector<Tensor> params = test::randomParams(*cell, cell->sizes, rng);
      auto prepared = compiled->prepare(params, 1);
      for (int64_t batch : {1, 5, 13, 40}) {
        std::vector<Tensor> inputs = {test::randomTensor({steps, batch, input}, rng)};
        std::vector<Tensor> states0;
        for (size_t s = 0; s < cell->states.size(); ++s)
          states0.push_back(test::randomTensor({batch, hidden}, rng));
        // Variable length: every sequence one step shorter than the one before, at least 1.
        std::vector<int64_t> batchSizes;
        for (int64_t t = 0; t < steps; ++t)
          batchSizes.push_back(std::max<int64_t>(1, batch - t));
        int64_t packedRows = 0;
        for (int64_t b : batchSizes)
          packedRows += b;
        std::vector<Tensor> packedInputs = {test::randomTensor({packedRows, input}, rng)};
        Tensor oneOutput, onePacked;
        std::vector<Tensor> oneStates, onePackedStates;
        for (int threads : {1, 2, 3}) {
          CompiledCell::Workspace workspace;
          std::vector<Tensor> states = states0, packedStates = states0;
          Tensor output, packedOutput;
          compiled->run(*prepared, inputs, states, output, workspace, threads);
          compiled->runPacked(*prepared, packedInputs, batchSizes, packedStates, packedOutput,
                              workspace, threads);
          if (threads == 1) {
            oneOutput = output, oneStates = states;
            onePacked = packedOutput, onePackedStates = packedStates;
            continue;
          }
          const std::string where = cpu + " " + name + " B=" + std::to_string(batch) + " on " +
                                    std::to_string(threads) + " threads";
          EXPECT_EQ(output.values(), oneOutput.values()) << where;
          EXPECT_EQ(packedOutput.values(), onePacked.values()) << where << ", packed";
          for (size_t i = 0; i < states.size(); ++i) {
            EXPECT_EQ(states[i].values(), oneStates[i].values()) << where << " state " << i;
            EXPECT_EQ(packedStates[i].values(), onePackedStates[i].values())
                << where << " packed state " << i;
          }
        }
      }
    }
}

// A reverse run (the steps from the last to the first, each output row at its step) against
// the forward run of a time-reversed copy, reversed back: LSTM (states in their own buffers),
// GRU and the vanilla RNN (the state read from the previous step's output rows), in chunks of
// a few steps (a small sequence buffer) and whole, on one thread and two, AVX2 and AVX-512.
TEST(JitReverse, RunsTheStepsBackwardsLikeAReversedCopy) {
  for (const std::string& cpu : test::runnableCpus())
    for (const char* name : {"lstm", "gru", "rnn_tanh"})
      for (int64_t bufferBytes : {int64_t{4096}, int64_t{32} << 20}) {
        auto cell = frontend::loadCell(name);
        const int64_t input = 9, hidden = 21, steps = 7, batch = 5;
        cell->bindSizes({{"input_size", input}, {"hidden_size", hidden}});
        CompileOptions options;
        options.targetCpu = cpu;
        options.sequenceBufferBytes = bufferBytes;
        auto compiled = CompiledCell::compile(*cell, options);
        std::mt19937 rng(8);
        std::vector<Tensor> params = test::randomParams(*cell, cell->sizes, rng);
        auto prepared = compiled->prepare(params, 1);
        Tensor x = test::randomTensor({steps, batch, input}, rng);
        Tensor flipped({steps, batch, input});
        for (int64_t t = 0; t < steps; ++t)
          std::copy_n(x.data() + (steps - 1 - t) * batch * input, batch * input,
                      flipped.data() + t * batch * input);
        std::vector<Tensor> states0;
        for (size_t s = 0; s < cell->states.size(); ++s)
          states0.push_back(test::randomTensor({batch, hidden}, rng));
        for (int threads : {1, 2}) {
          const std::string where = cpu + " " + name + " buffer " + std::to_string(bufferBytes) +
                                    " on " + std::to_string(threads) + " threads";
          CompiledCell::Workspace workspace;
          std::vector<Tensor> expectedStates = states0, states = states0;
          Tensor expected, actual;
          compiled->run(*prepared, {flipped}, expectedStates, expected, workspace, threads);
          compiled->run(*prepared, steps, batch, {InputRows::of(x)}, states, actual, workspace,
                        threads, /*reverse=*/true);
          ASSERT_EQ(actual.shape(), expected.shape()) << where;
          const int64_t width = actual.dim(2);
          float worst = 0;
          for (int64_t t = 0; t < steps; ++t)
            for (int64_t i = 0; i < batch * width; ++i)
              worst = test::worseOf(worst,
                                    std::abs(actual.data()[t * batch * width + i] -
                                             expected.data()[(steps - 1 - t) * batch * width + i]));
          EXPECT_LT(worst, 1e-5f) << where;
          for (size_t i = 0; i < states.size(); ++i)
            EXPECT_LT(test::maxAbsDiff(states[i], expectedStates[i]), 1e-5f)
                << where << " state " << i;
        }
      }
}

// Inputs read where they are (InputRows): x as columns of a wider tensor whose other columns are
// NaN, padded and packed, against the interpreter on a dense copy; a NaN read would show.
TEST(JitStridedInputs, ColumnsOfAWiderTensorMatchTheInterpreter) {
  for (const char* name : {"lstm", "gru", "rnn_tanh"}) {
    auto cell = frontend::loadCell(name);
    const int64_t input = 13, hidden = 21, steps = 5, batch = 7, left = 3, wide = input + 8;
    cell->bindSizes({{"input_size", input}, {"hidden_size", hidden}});
    std::mt19937 rng(5);
    std::vector<Tensor> params = test::randomParams(*cell, cell->sizes, rng);
    auto compiled = CompiledCell::compile(*cell);
    auto prepared = compiled->prepare(params, 1);
    Tensor x = test::randomTensor({steps, batch, input}, rng);
    Tensor around({steps, batch, wide}, std::nanf(""));
    for (int64_t r = 0; r < steps * batch; ++r)
      std::copy(x.data() + r * input, x.data() + (r + 1) * input, around.data() + r * wide + left);
    std::vector<Tensor> states, expectedStates;
    for (size_t s = 0; s < cell->states.size(); ++s)
      states.push_back(test::randomTensor({batch, hidden}, rng));
    expectedStates = states;
    Tensor expected = Interpreter(*cell, params).run({x}, expectedStates);
    InputRows columns{around.data() + left, steps * batch, input, wide};
    Tensor output;
    CompiledCell::Workspace workspace;
    compiled->run(*prepared, steps, batch, {columns}, states, output, workspace, 1);
    EXPECT_LT(test::maxAbsDiff(output, expected), 1e-5) << name;
    for (size_t i = 0; i < states.size(); ++i)
      EXPECT_LT(test::maxAbsDiff(states[i], expectedStates[i]), 1e-5) << name << " state " << i;

    // Packed: every sequence all steps long, so the packed rows are the padded ones.
    std::vector<Tensor> packedStates = expectedStates; // any states: compare with a dense run
    std::vector<Tensor> denseStates = packedStates;
    Tensor packedOutput, denseOutput;
    std::vector<int64_t> batchSizes(steps, batch);
    compiled->runPacked(*prepared, {columns}, batchSizes, packedStates, packedOutput, workspace, 1);
    compiled->runPacked(*prepared, {x.reshaped({steps * batch, input})}, batchSizes, denseStates,
                        denseOutput, workspace, 1);
    EXPECT_LT(test::maxAbsDiff(packedOutput, denseOutput), 1e-6) << name;
  }
}

std::vector<JitCase> jitCases() {
  std::vector<JitCase> cases;
  for (const auto& name : frontend::builtinCellNames())
    cases.push_back({name, ""});
  cases.push_back({"four_gate_lstm", test::kFourGateLstm});
  cases.push_back({"everything", kEverything});
  cases.push_back({"concat_output", kConcatOutput});
  std::string nested = kConcatOutput;
  nested.replace(nested.find("cat(h2, c, gf, gi, gi)"), 22, "cat(cat(gf, gi, h2), cat(gi, c2))");
  cases.push_back({"nested_concat_output", nested});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cells, JitMatchesInterpreter, testing::ValuesIn(jitCases()),
                         [](const auto& info) { return info.param.name; });

} // namespace

// The generated matrix products (codegen/StoragePlan.h, PackedProduct) against the interpreter:
// the input projection over T*B rows (fused with its bias kernel, chunked by rows), the
// recurrent product, and standalone products (fuse-matmul off, premultiply off), at sizes that
// are no multiple of any tile, at T=1, and across chunk boundaries; for the AVX2 code (haswell)
// and, where this host runs it, the AVX-512 code (skylake-avx512); on 1 and 2 threads.
#include "codegen/HostTarget.h"
#include "codegen/StoragePlan.h"
#include "codegen/Target.h"
#include "frontend/BuiltinCells.h"
#include "runtime/exec/CompiledCell.h"
#include "runtime/exec/Interpreter.h"
#include "tests/RunnableCpus.h"
#include "tests/TestSupport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

using namespace rnnc;

namespace {

struct Shape {
  const char* cell;
  int64_t input, hidden, steps, batch;
};

using test::runnableCpus;

struct Setting {
  const char* name;
  passes::PipelineOptions pipeline;
};

std::vector<Setting> settings() {
  passes::PipelineOptions noMatMulFusion, noPremul;
  noMatMulFusion.disabled.insert("fuse-matmul");
  noPremul.premultiply = false;
  return {{"default", {}}, {"no fuse-matmul", noMatMulFusion}, {"no premultiply", noPremul}};
}

float maxAbs(const Tensor& t) {
  float m = 0;
  for (float v : t.values())
    m = std::max(m, std::fabs(v));
  return m;
}

void expectMatchesInterpreter(const Shape& shape, const std::string& cpu, const Setting& setting,
                              int threads) {
  SCOPED_TRACE(std::string(shape.cell) + " I=" + std::to_string(shape.input) +
               " H=" + std::to_string(shape.hidden) + " T=" + std::to_string(shape.steps) +
               " B=" + std::to_string(shape.batch) + " on " + cpu + ", " + setting.name + ", " +
               std::to_string(threads) + " threads");
  auto cell = frontend::loadCell(shape.cell);
  cell->bindSizes({{"input_size", shape.input}, {"hidden_size", shape.hidden}});
  std::mt19937 rng(static_cast<unsigned>(shape.input * 31 + shape.hidden));
  std::vector<Tensor> params = test::randomParams(*cell, cell->sizes, rng);
  std::vector<Tensor> inputs = {
      test::randomTensor({shape.steps, shape.batch, shape.input}, rng, 1.0f)};
  std::vector<Tensor> states;
  for (size_t i = 0; i < cell->states.size(); ++i)
    states.push_back(test::randomTensor({shape.batch, shape.hidden}, rng));
  std::vector<Tensor> expectedStates = states;
  Tensor expected = Interpreter(*cell, params).run(inputs, expectedStates);

  CompileOptions options;
  options.pipeline = setting.pipeline;
  options.targetCpu = cpu;
  options.cache.disk = false;
  auto compiled = CompiledCell::compile(*cell, options);
  Tensor actual;
  CompiledCell::Workspace workspace;
  compiled->run(params, inputs, states, actual, workspace, threads);
  const float tolerance = 1e-5f * std::max(1.0f, maxAbs(expected));
  EXPECT_LT(test::maxAbsDiff(actual, expected), tolerance);
  for (size_t i = 0; i < states.size(); ++i)
    EXPECT_LT(test::maxAbsDiff(states[i], expectedStates[i]), tolerance) << "state " << i;
}

TEST(JitGemm, AwkwardSizesMatchTheInterpreterOnEveryTargetAndSetting) {
  // H = 11: 44 LSTM columns, 33 GRU columns, neither a multiple of 16 or 32; B = 13 and I = 7
  // are no multiple of any tile height or vector; T = 1 is a pre block of one step.
  const Shape shapes[] = {{"lstm", 7, 11, 5, 13},
                          {"lstm", 33, 11, 1, 13},
                          {"gru", 7, 11, 3, 13},
                          {"rnn_tanh", 20, 37, 4, 3},
                          {"lstm", 9, 5, 2, 1}};
  for (const std::string& cpu : runnableCpus())
    for (const Setting& setting : settings())
      for (const Shape& shape : shapes)
        for (int threads : {1, 2})
          expectMatchesInterpreter(shape, cpu, setting, threads);
}

TEST(JitGemm, TheInputProjectionCrossesItsRowChunks) {
  // I = 1000: 4000-byte rows, so a chunk (half of L2, at most 256 rows) is 60 to 256 rows on any
  // L2 of 512 KB or more, and T*B = 23 * 29 = 667 rows cross at least one chunk boundary, with a
  // short last chunk; on two threads each thread's half (333 and 334 rows) is chunked on its own.
  const Shape shapes[] = {{"lstm", 1000, 9, 23, 29}, {"gru", 1000, 6, 23, 29}};
  for (const std::string& cpu : runnableCpus()) {
    for (const Shape& shape : shapes) {
      auto cell = frontend::loadCell(shape.cell);
      cell->bindSizes({{"input_size", shape.input}, {"hidden_size", shape.hidden}});
      CompileOptions options;
      options.targetCpu = cpu;
      options.cache.disk = false;
      auto compiled = CompiledCell::compile(*cell, options);
      codegen::StoragePlan plan =
          codegen::planStorage(compiled->optimisedCell(), codegen::runnableTarget(cpu));
      const codegen::PackedProduct& input = plan.packedProducts.at(0);
      ASSERT_TRUE(input.splitRows);
      ASSERT_LT(input.chunkRows, shape.steps * shape.batch / 2) << "no chunk boundary crossed";
      for (int threads : {1, 2})
        expectMatchesInterpreter(shape, cpu, settings()[0], threads);
    }
  }
}

TEST(JitGemm, CodeForACpuThisHostCannotRunIsRefused) {
  CompileOptions options;
  options.targetCpu = "no-such-cpu";
  auto cell = frontend::loadCell("rnn_tanh");
  cell->bindSizes({{"input_size", 3}, {"hidden_size", 4}});
  EXPECT_THROW(CompiledCell::compile(*cell, options), UserError);
  if (!codegen::detectHostTarget().has("avx512f")) {
    options.targetCpu = "skylake-avx512";
    EXPECT_THROW(CompiledCell::compile(*cell, options), UserError);
  }
}

} // namespace

namespace {

// Sequences longer than CompileOptions::sequenceBufferBytes allows run in chunks of steps, each
// chunk's pre phase just ahead of its steps; padded and packed runs alike. The oracle is the
// interpreter on each sequence alone.
TEST(JitChunks, ChunksOfStepsMatchTheInterpreterSequenceBySequence) {
  for (const char* name : {"lstm", "gru"}) {
    SCOPED_TRACE(name);
    auto cell = frontend::loadCell(name);
    const int64_t input = 5, hidden = 7;
    cell->bindSizes({{"input_size", input}, {"hidden_size", hidden}});
    std::mt19937 rng(5);
    std::vector<Tensor> params = test::randomParams(*cell, cell->sizes, rng);
    const std::vector<int64_t> lengths = {6, 6, 5, 3, 3, 1}; // sorted, as packed batches are
    const int64_t steps = 6, batch = static_cast<int64_t>(lengths.size());
    Tensor x = test::randomTensor({steps, batch, input}, rng, 1.0f);

    CompileOptions options;
    options.cache.disk = false;
    // The pre buffers' bytes per row, read off the plan: room for 13 rows, so a padded run of
    // 6 sequences takes chunks of two steps, and a packed one (6, 5, 5, 3, 3, 2 rows a step)
    // chunks of 6 + 5 and 5 + 3 + 3 + 2 rows: several stretches in a chunk.
    auto probe = CompiledCell::compile(*cell, options);
    int64_t rowBytes = 0;
    for (const auto& spec :
         codegen::planStorage(probe->optimisedCell(), codegen::runnableTarget("")).buffers)
      if (spec.rows == codegen::Rows::Sequence)
        rowBytes += spec.cols * 4;
    ASSERT_GT(rowBytes, 0);
    options.sequenceBufferBytes = 13 * rowBytes;
    auto compiled = CompiledCell::compile(*cell, options);
    auto prepared = compiled->prepare(params, 1);

    // Each sequence alone on the interpreter: its outputs and final states.
    std::vector<Tensor> expectedOutputs;
    std::vector<std::vector<Tensor>> expectedStates;
    std::vector<std::vector<Tensor>> initialStates(lengths.size());
    for (size_t b = 0; b < lengths.size(); ++b) {
      Tensor xb({lengths[b], 1, input});
      for (int64_t t = 0; t < lengths[b]; ++t)
        for (int64_t f = 0; f < input; ++f)
          xb.values()[static_cast<size_t>(t * input + f)] =
              x.values()[static_cast<size_t>((t * batch + static_cast<int64_t>(b)) * input + f)];
      for (size_t s = 0; s < cell->states.size(); ++s)
        initialStates[b].push_back(test::randomTensor({1, hidden}, rng));
      std::vector<Tensor> states = initialStates[b];
      expectedOutputs.push_back(Interpreter(*cell, params).run({xb}, states));
      expectedStates.push_back(states);
    }
    auto stateRows = [&](size_t s, size_t rows) {
      Tensor t({static_cast<int64_t>(rows), hidden});
      for (size_t b = 0; b < rows; ++b)
        std::copy_n(initialStates[b][s].values().begin(), hidden,
                    t.values().begin() + static_cast<std::ptrdiff_t>(b) * hidden);
      return t;
    };

    // Padded: every sequence runs 6 steps; the first two have length 6, so they are checked.
    {
      std::vector<Tensor> states;
      for (size_t s = 0; s < cell->states.size(); ++s)
        states.push_back(stateRows(s, lengths.size()));
      Tensor output;
      CompiledCell::Workspace workspace;
      compiled->run(*prepared, {x}, states, output, workspace, 1);
      for (size_t b = 0; b < 2; ++b)
        for (int64_t t = 0; t < steps; ++t)
          for (int64_t f = 0; f < hidden; ++f)
            EXPECT_NEAR(output.values()[static_cast<size_t>(
                            (t * batch + static_cast<int64_t>(b)) * hidden + f)],
                        expectedOutputs[b].values()[static_cast<size_t>(t * hidden + f)], 1e-5)
                << "padded b=" << b << " t=" << t;
    }

    // Packed: step after step, the rows of the sequences still running.
    std::vector<int64_t> batchSizes;
    for (int64_t t = 0; t < steps; ++t)
      batchSizes.push_back(std::count_if(lengths.begin(), lengths.end(),
                                         [&](int64_t length) { return length > t; }));
    std::vector<float> packed;
    for (int64_t t = 0; t < steps; ++t)
      for (int64_t b = 0; b < batchSizes[static_cast<size_t>(t)]; ++b)
        for (int64_t f = 0; f < input; ++f)
          packed.push_back(x.values()[static_cast<size_t>((t * batch + b) * input + f)]);
    Tensor packedInput({static_cast<int64_t>(packed.size()) / input, input});
    packedInput.values().assign(packed.begin(), packed.end());
    std::vector<Tensor> states;
    for (size_t s = 0; s < cell->states.size(); ++s)
      states.push_back(stateRows(s, lengths.size()));
    Tensor output;
    CompiledCell::Workspace workspace;
    compiled->runPacked(*prepared, {packedInput}, batchSizes, states, output, workspace, 1);
    int64_t row = 0;
    for (int64_t t = 0; t < steps; ++t)
      for (int64_t b = 0; b < batchSizes[static_cast<size_t>(t)]; ++b, ++row)
        for (int64_t f = 0; f < hidden; ++f)
          EXPECT_NEAR(
              output.values()[static_cast<size_t>(row * hidden + f)],
              expectedOutputs[static_cast<size_t>(b)].values()[static_cast<size_t>(t * hidden + f)],
              1e-5)
              << "packed b=" << b << " t=" << t;
    for (size_t s = 0; s < states.size(); ++s)
      for (size_t b = 0; b < lengths.size(); ++b)
        for (int64_t f = 0; f < hidden; ++f)
          EXPECT_NEAR(states[s].values()[b * static_cast<size_t>(hidden) + static_cast<size_t>(f)],
                      expectedStates[b][s].values()[static_cast<size_t>(f)], 1e-5)
              << "final state " << s << " b=" << b;
  }
}

} // namespace

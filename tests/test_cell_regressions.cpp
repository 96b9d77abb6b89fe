// Cells that once stopped with an internal error in some pass setting while the interpreter ran
// them (issue 13's reproductions), run by the JIT under every pass setting, on 1 and 2 threads,
// against the interpreter.
#include "frontend/CellParser.h"
#include "passes/PassManager.h"
#include "runtime/SequenceRunner.h"
#include "tests/TestSupport.h"

#include <gtest/gtest.h>

#include <random>

using namespace rnnc;

namespace {

// A bias-free input projection chunked and read raw inside the step: premultiply leaves a pre
// kernel of slices only ("no storage for a value the generated code reads").
const char* kRawChunks = R"(cell raw_chunks(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[2*hidden_size, input_size], u[hidden_size, hidden_size]
  a, b = chunk(x @ w^T, 2)
  h2 = tanh(a + h @ u^T) * b
  return h = h2; output h2
})";

// A minimal gated unit: without premultiply, fuse-matmul pulled the stacked input projection
// into the first kernel while its second slice was read by the next kernel.
const char* kMinimalGatedUnit = R"(cell mgu(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w_f[hidden_size, input_size], u_f[hidden_size, hidden_size], b_f[hidden_size]
  param w_h[hidden_size, input_size], u_h[hidden_size, hidden_size], b_h[hidden_size]
  f = sigmoid(linear(x, w_f, b_f) + linear(h, u_f))
  hc = tanh(linear(x, w_h, b_h) + linear(f * h, u_h))
  h2 = (1 - f) * h + f * hc
  return h = h2; output h2
})";

struct Setting {
  std::string name;
  passes::PipelineOptions pipeline;
};

// The default pipeline, each pass disabled alone, no premultiply, no fusion.
std::vector<Setting> everySetting() {
  std::vector<Setting> settings = {{"default", {}}};
  for (const passes::Pass& pass : passes::allPasses()) {
    passes::PipelineOptions options;
    options.disabled.insert(pass.name);
    settings.push_back({"without " + pass.name, options});
  }
  passes::PipelineOptions noPremul, noFuse;
  noPremul.premultiply = false;
  noFuse.fuse = false;
  settings.push_back({"no premultiply", noPremul});
  settings.push_back({"no fusion", noFuse});
  return settings;
}

TEST(CellRegressions, ReproductionsRunUnderEveryPassSetting) {
  for (const auto& [name, source] :
       {std::pair{"raw_chunks", kRawChunks}, std::pair{"mgu", kMinimalGatedUnit}}) {
    auto cell = frontend::parseCell(source, std::string(name) + ".cell");
    std::mt19937 rng(3);
    ir::SizeMap sizes = {{"input_size", 5}, {"hidden_size", 9}};
    TensorMap weights = test::randomWeights(*cell, sizes, rng);
    SequenceRequest request;
    request.weights = &weights;
    request.inputs["x"] = test::randomTensor({4, 3, 5}, rng);
    request.initialStates["h"] = test::randomTensor({1, 3, 9}, rng);
    request.engine = Engine::Interpreter;
    SequenceResult expected = runSequence(*cell, request);
    request.engine = Engine::Jit;
    request.compile.cache.disk = false;
    for (const Setting& setting : everySetting())
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(name) + ", " + setting.name + ", " + std::to_string(threads) +
                     " threads");
        request.compile.pipeline = setting.pipeline;
        request.threads = threads;
        SequenceResult actual = runSequence(*cell, request);
        ASSERT_EQ(actual.engine, Engine::Jit);
        EXPECT_LT(test::maxAbsDiff(actual.output, expected.output), 1e-5);
        EXPECT_LT(test::maxAbsDiff(actual.finalStates.at("h"), expected.finalStates.at("h")), 1e-5);
      }
  }
}

} // namespace

// Dropout inside a cell in training (passes/TrainingDropout.h): the JIT draws the interpreter's
// masks whatever the passes hoist out of the loop, the chunks of steps, the directions, the
// lengths and the threads; masks follow the seed and each dropout has its own. Their gradients
// are in test_gradients.cpp.
#include "frontend/CellParser.h"
#include "ir/Printer.h"
#include "passes/TrainingDropout.h"
#include "runtime/exec/Hash.h"
#include "runtime/layers/LayerRunner.h"
#include "tests/DroppingCell.h"
#include "tests/RandomTensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace rnnc {
namespace {

struct DroppingRun {
  bool bidirectional = false;
  bool lengths = false;
  int layers = 1;
};

LayerResult runDropping(const ir::Cell& cell, const TensorMap& weights, Engine engine,
                        const DroppingRun& shape, int threads, int64_t chunkBytes,
                        bool training = true, uint64_t seed = 5) {
  std::mt19937 rng(3);
  LayerRequest request;
  request.weights = &weights;
  request.input = test::randomTensor({7, 3, 5}, rng, 1.0f);
  if (shape.lengths)
    request.lengths = Int64Array{{3}, {7, 2, 5}};
  LayerOptions options;
  options.engine = engine;
  options.training = training;
  options.seed = seed;
  options.threads = threads;
  options.bidirectional = shape.bidirectional;
  options.numLayers = shape.layers;
  if (chunkBytes > 0)
    options.compile.sequenceBufferBytes = chunkBytes;
  return runLayers(cell, request, options);
}

TensorMap droppingWeights(const ir::Cell& cell, const DroppingRun& shape) {
  std::mt19937 rng(11);
  TensorMap weights;
  for (int layer = 0; layer < shape.layers; ++layer)
    for (int direction = 0; direction < (shape.bidirectional ? 2 : 1); ++direction) {
      const std::string suffix = "_l" + std::to_string(layer) + (direction == 1 ? "_reverse" : "");
      const int64_t in = layer == 0 ? 5 : (shape.bidirectional ? 14 : 7);
      weights["w" + suffix] = test::randomTensor({7, in}, rng, 0.6f);
      weights["u" + suffix] = test::randomTensor({7, 7}, rng, 0.6f);
      weights["b" + suffix] = test::randomTensor({7}, rng, 0.3f);
    }
  return weights;
}

float maxDifference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  float most = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    most = std::max(most, std::abs(a.data()[i] - b.data()[i]));
  return most;
}

// The output of a cell without parameters over `input`, in training mode.
Tensor trainWithoutWeights(const ir::Cell& cell, Tensor input, Engine engine, uint64_t seed) {
  TensorMap none;
  LayerRequest request;
  request.weights = &none;
  request.input = std::move(input);
  LayerOptions options;
  options.training = true;
  options.seed = seed;
  options.engine = engine;
  return runLayers(cell, request, options).output;
}

TEST(TrainingDropout, TheJitDrawsTheInterpretersMasks) {
  auto cell = frontend::parseCell(test::kDroppingCell, "dropping.cell");
  const DroppingRun shapes[] = {{false, false, 1}, {true, false, 1},  {false, true, 1},
                                {true, true, 1},   {false, false, 2}, {true, true, 2}};
  for (const DroppingRun& shape : shapes) {
    TensorMap weights = droppingWeights(*cell, shape);
    LayerResult expected = runDropping(*cell, weights, Engine::Interpreter, shape, 1, 0);
    LayerResult inference =
        runDropping(*cell, weights, Engine::Interpreter, shape, 1, 0, /*training=*/false);
    EXPECT_GT(maxDifference(expected.output, inference.output), 0.1f) << "no mask was drawn";
    // A chunk of a step or two (1 byte of pre buffer) runs the pre phase per chunk: its masks'
    // rows start past the chunks before, counted backwards in the reverse direction.
    for (int threads : {1, 2})
      for (int64_t chunkBytes : {int64_t{0}, int64_t{1}}) {
        SCOPED_TRACE(testing::Message() << "bidirectional " << shape.bidirectional << ", lengths "
                                        << shape.lengths << ", layers " << shape.layers
                                        << ", threads " << threads << ", chunk " << chunkBytes);
        LayerResult actual = runDropping(*cell, weights, Engine::Jit, shape, threads, chunkBytes);
        EXPECT_LT(maxDifference(actual.output, expected.output), 1e-5f);
        EXPECT_LT(maxDifference(actual.finalStates.at("h"), expected.finalStates.at("h")), 1e-5f);
      }
  }
}

TEST(TrainingDropout, MasksFollowTheSeedAndEachDropoutHasItsOwn) {
  // Two dropouts of the same value with the same p: common subexpression elimination must not
  // make them one mask.
  auto cell = frontend::parseCell(R"(cell twice(n) {
  input x[n]
  state h[n]
  a = dropout(x, 0.5)
  b = dropout(x, 0.5)
  return h = h; output a - b
})",
                                  "twice.cell");
  const Tensor x({6, 4, 64}, 1.0f);
  for (Engine engine : {Engine::Interpreter, Engine::Jit}) {
    Tensor out = trainWithoutWeights(*cell, x, engine, 1);
    // a - b is +-2 where exactly one of the masks keeps x: about half the elements.
    int64_t differ = 0;
    for (float v : out.values()) {
      EXPECT_TRUE(v == 0.0f || std::abs(std::abs(v) - 2.0f) < 1e-6f) << v;
      differ += v != 0.0f;
    }
    EXPECT_NEAR(static_cast<double>(differ) / out.numel(), 0.5, 0.08);
    EXPECT_NE(trainWithoutWeights(*cell, x, engine, 2).values(), out.values());
    EXPECT_EQ(trainWithoutWeights(*cell, x, engine, 1).values(), out.values());
  }
}

TEST(TrainingDropout, AMaskIsKeptScaledOrDroppedAtTheRateAsked) {
  auto cell = frontend::parseCell(R"(cell once(n) {
  input x[n]
  state h[n]
  return h = h; output dropout(x, 0.3)
})",
                                  "once.cell");
  Tensor out = trainWithoutWeights(*cell, Tensor({8, 16, 256}, 2.0f), Engine::Jit, 0);
  int64_t dropped = 0;
  for (float v : out.values()) {
    EXPECT_TRUE(v == 0.0f || std::abs(v - 2.0f / 0.7f) < 1e-5f) << v;
    dropped += v == 0.0f;
  }
  EXPECT_NEAR(static_cast<double>(dropped) / out.numel(), 0.3, 0.01);
}

// The masks compare the hash's top 53 bits with ceil(p * 2^53), in integers: the same decision
// as unitInterval(hash) < p, the definition, at the boundaries too.
TEST(TrainingDropout, TheIntegerThresholdDecidesAsTheUnitInterval) {
  std::mt19937_64 rng(7);
  for (double p : {0.0, 0.1, 0.25, 0.5, 1.0 / 3.0, 0.999, 0x1.0p-53 * 12345}) {
    const uint64_t threshold = dropoutThreshold(p);
    for (int i = 0; i < 20000; ++i) {
      const uint64_t rowHash = rng(), column = rng() % 4096;
      const bool dropped = unitInterval(splitmix64(rowHash ^ column)) < p;
      EXPECT_EQ(dropoutMaskValue(rowHash, column, threshold, 2.0f), dropped ? 0.0f : 2.0f) << p;
    }
    // Hashes whose top 53 bits are right at p * 2^53 (kept) and just below (dropped).
    const uint64_t at = static_cast<uint64_t>(p * 0x1.0p53);
    for (uint64_t k : {at, at == 0 ? 0 : at - 1, at + 1}) {
      const uint64_t hash = k << 11;
      EXPECT_EQ((hash >> 11) < threshold, unitInterval(hash) < p) << p << " " << k;
    }
  }
}

// A dropout of a per-step value (x) and one of parameters alone (v).
constexpr const char* kMixedCell = R"(cell mixed(n) {
  input x[n]
  state h[n]
  param v[n]
  return h = h + dropout(v, 0.5); output dropout(x, 0.25)
})";

// Inference leaves dropout alone (the identity); training makes each mask explicit, and a
// dropout of parameters alone (no rows to draw a mask for) stays for lowerParameterDropout.
TEST(TrainingDropout, OnlyDropoutsOfPerStepValuesBecomeMasks) {
  auto cell = frontend::parseCell(kMixedCell, "mixed.cell");
  EXPECT_TRUE(passes::lowerTrainingDropout(*cell));
  const std::string text = ir::toString(*cell);
  EXPECT_NE(text.find("dropout_mask %x {p = 0.25, stream = 1}"), std::string::npos) << text;
  EXPECT_NE(text.find("dropout %v {p = 0.5}"), std::string::npos) << text;
  EXPECT_FALSE(passes::lowerTrainingDropout(*cell)) << "nothing left to make explicit";
}

// A dropout of parameters alone becomes a mask parameter, numbered as the dropouts are.
TEST(TrainingDropout, ADropoutOfParametersAloneBecomesAMaskParameter) {
  auto cell = frontend::parseCell(kMixedCell, "mixed.cell");
  passes::lowerTrainingDropout(*cell);
  const std::vector<passes::ParameterDropout> lowered = passes::lowerParameterDropout(*cell);
  ASSERT_EQ(lowered.size(), 1u);
  EXPECT_EQ(lowered[0].stream, 0);
  EXPECT_EQ(lowered[0].p, 0.5);
  EXPECT_EQ(lowered[0].mask->name, "dropout_mask.0");
  const std::string text = ir::toString(*cell);
  EXPECT_NE(text.find("mul %v, %dropout_mask.0"), std::string::npos) << text;
  EXPECT_EQ(text.find("dropout %"), std::string::npos) << text;
  EXPECT_NE(text.find("dropout_mask %x {p = 0.25, stream = 1}"), std::string::npos) << text;
}

// A recurrent weight's dropout (AWD-LSTM's weight drop, DropConnect) in training: one mask for
// the whole run, the same for every step and row. The oracle: the same cell without the dropout,
// on the interpreter in inference, with the weight multiplied by the mask drawn here from the
// seed (runtime/exec/Hash.h: row r of the weight, the dropout's stream 0). On the JIT and the
// interpreter; another seed, another mask.
TEST(TrainingDropout, AWeightsDropoutIsOneMaskForTheWholeRun) {
  const char* dropping = R"(cell weightdrop(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size], b[hidden_size]
  h2 = tanh(linear(x, w, b) + linear(h, dropout(u, 0.4)))
  return h = h2; output h2
})";
  const char* plain = R"(cell plain(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size], b[hidden_size]
  h2 = tanh(linear(x, w, b) + linear(h, u))
  return h = h2; output h2
})";
  auto cell = frontend::parseCell(dropping, "weightdrop.cell");
  auto reference = frontend::parseCell(plain, "plain.cell");
  std::mt19937 rng(29);
  const int64_t hidden = 9;
  TensorMap weights;
  weights["w"] = test::randomTensor({hidden, 5}, rng, 0.6f);
  weights["u"] = test::randomTensor({hidden, hidden}, rng, 0.6f);
  weights["b"] = test::randomTensor({hidden}, rng, 0.3f);
  const uint64_t seed = 41;
  TensorMap masked = weights;
  int64_t dropped = 0;
  for (int64_t r = 0; r < hidden; ++r) {
    std::vector<float> mask(static_cast<size_t>(hidden));
    fillDropoutMaskRow(seed, 0, static_cast<uint64_t>(r), 0.4, mask.data(), hidden);
    for (int64_t c = 0; c < hidden; ++c) {
      dropped += mask[static_cast<size_t>(c)] == 0.0f;
      masked.at("u").data()[r * hidden + c] *= mask[static_cast<size_t>(c)];
    }
  }
  EXPECT_GT(dropped, hidden * hidden / 5);
  EXPECT_LT(dropped, hidden * hidden * 3 / 5);
  const Tensor expected =
      runDropping(*reference, masked, Engine::Interpreter, {}, 1, 0, /*training=*/false).output;
  for (Engine engine : {Engine::Jit, Engine::Interpreter}) {
    SCOPED_TRACE(engineName(engine));
    const Tensor out = runDropping(*cell, weights, engine, {}, 1, 0, true, seed).output;
    ASSERT_EQ(out.shape(), expected.shape());
    for (int64_t i = 0; i < out.numel(); ++i)
      EXPECT_NEAR(out.data()[i], expected.data()[i], 1e-5) << "entry " << i;
    const Tensor other = runDropping(*cell, weights, engine, {}, 1, 0, true, seed + 7).output;
    double difference = 0;
    for (int64_t i = 0; i < out.numel(); ++i)
      difference += std::abs(other.data()[i] - out.data()[i]);
    EXPECT_GT(difference, 1e-3) << "another seed draws another mask";
  }
}

} // namespace
} // namespace rnnc

// Whole layers (stacks, directions, batch_first, projections, variable lengths) against
// torch.nn.LSTM/GRU/RNN: the fixtures in tests/fixtures/layers, through the JIT and the
// interpreter.
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "ir/Error.h"
#include "runtime/data/Npy.h"
#include "runtime/layers/LayerRunner.h"

#include "tests/TestSupport.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

using namespace rnnc;

namespace {

const std::string kLayerFixtures = std::string(RNNC_SOURCE_DIR) + "/tests/fixtures/layers/";

std::vector<std::string> layerCases() {
  std::vector<std::string> cases;
  for (const auto& entry : std::filesystem::directory_iterator(kLayerFixtures))
    if (entry.is_directory())
      cases.push_back(entry.path().filename().string());
  std::sort(cases.begin(), cases.end());
  return cases;
}

using test::maxAbsDiff;

struct LayerCase {
  std::string name;
  Engine engine;
};

void PrintTo(const LayerCase& c, std::ostream* os) {
  *os << c.name << " (" << engineName(c.engine) << ")";
}

class PyTorchLayer : public testing::TestWithParam<LayerCase> {};

TEST_P(PyTorchLayer, MatchesWithin1e5) {
  const std::string dir = kLayerFixtures + GetParam().name + "/";
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir + "meta.json"));
  std::string mode = meta["mode"];
  bool projected = meta["proj_size"].get<int>() > 0;
  auto cell = frontend::loadCell(projected ? "lstm_proj" : mode);
  TensorMap weights = readSafeTensors(dir + "weights.safetensors");

  LayerRequest request;
  request.weights = &weights;
  request.input = readNpyFloat32(dir + "input.npy");
  request.initialStates["h"] = readNpyFloat32(dir + "h0.npy");
  bool hasC = mode == "lstm";
  if (hasC)
    request.initialStates["c"] = readNpyFloat32(dir + "c0.npy");
  if (meta["has_lengths"].get<bool>())
    request.lengths = readNpyInt64(dir + "lengths.npy");
  LayerOptions options;
  options.numLayers = meta["num_layers"].get<int>();
  options.bidirectional = meta["bidirectional"].get<bool>();
  options.batchFirst = meta["batch_first"].get<bool>();
  options.engine = GetParam().engine;

  LayerResult result = runLayers(*cell, request, options);
  EXPECT_LE(maxAbsDiff(result.output, readNpyFloat32(dir + "output.npy")), 1e-5f);
  EXPECT_LE(maxAbsDiff(result.finalStates.at("h"), readNpyFloat32(dir + "hn.npy")), 1e-5f);
  if (hasC) {
    EXPECT_LE(maxAbsDiff(result.finalStates.at("c"), readNpyFloat32(dir + "cn.npy")), 1e-5f);
  }
}

// A request whose weights are movable gives the same result, its tensors taken, not copied
// (left empty).
TEST(Layers, MovableWeightsAreTakenAndGiveTheSameResult) {
  const std::string dir = kLayerFixtures + "lstm_l2_bi_bf/";
  auto cell = frontend::loadCell("lstm");
  TensorMap weights = readSafeTensors(dir + "weights.safetensors");
  LayerRequest request;
  request.weights = &weights;
  request.input = readNpyFloat32(dir + "input.npy");
  request.initialStates["h"] = readNpyFloat32(dir + "h0.npy");
  request.initialStates["c"] = readNpyFloat32(dir + "c0.npy");
  LayerOptions options;
  options.batchFirst = true;
  const LayerResult copied = runLayers(*cell, request, options);
  EXPECT_LE(maxAbsDiff(copied.output, readNpyFloat32(dir + "output.npy")), 1e-5f);
  request.movableWeights = &weights;
  const LayerResult moved = runLayers(*cell, request, options);
  EXPECT_EQ(moved.output.values(), copied.output.values());
  for (const auto& [name, tensor] : weights)
    EXPECT_EQ(tensor.numel(), 0) << name;
  // The same through build's overload that takes the map.
  TensorMap given = readSafeTensors(dir + "weights.safetensors");
  auto program = LayerProgram::build(*cell, std::move(given), "weights", options);
  EXPECT_EQ(program->run(request.input, request.initialStates, std::nullopt).output.values(),
            copied.output.values());
}

std::vector<LayerCase> allLayerCases() {
  std::vector<LayerCase> cases;
  for (const auto& name : layerCases())
    // The GPU's kernels emulated on this CPU: stacks, directions, lengths and projections run
    // through them as through the JIT (on a GPU, tests/test_gpu.cpp runs them there).
    for (Engine engine : {Engine::Jit, Engine::Interpreter, Engine::CudaEmulated})
      cases.push_back({name, engine});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PyTorchLayer, testing::ValuesIn(allLayerCases()),
                         [](const auto& info) {
                           std::string engine = engineName(info.param.engine);
                           std::replace(engine.begin(), engine.end(), '-', '_');
                           return info.param.name + "_" + engine;
                         });

// ---- Bad input: each error names the tensor with its expected and actual shape ------------

class LayerErrors : public testing::Test {
protected:
  void SetUp() override {
    weights_ = readSafeTensors(kLayerFixtures + "lstm_l2_bi_bf/weights.safetensors");
    cell_ = frontend::loadCell("lstm");
    request_.weights = &weights_;
    request_.weightsSource = "w.safetensors";
    request_.input = readNpyFloat32(kLayerFixtures + "lstm_l2_bi_bf/input.npy");
    options_.batchFirst = true;
  }
  std::string error() {
    try {
      runLayers(*cell_, request_, options_);
    } catch (const UserError& e) {
      return e.what();
    }
    return "(no error)";
  }
  TensorMap weights_;
  std::unique_ptr<ir::Cell> cell_;
  LayerRequest request_;
  LayerOptions options_;
};

TEST_F(LayerErrors, ValidInputRunsAndInfersTheLayout) {
  LayerResult result = runLayers(*cell_, request_, options_);
  EXPECT_EQ(result.numLayers, 2);
  EXPECT_TRUE(result.bidirectional);
}

TEST_F(LayerErrors, LayoutOptionsAreCheckedAgainstTheWeights) {
  options_.numLayers = 3;
  EXPECT_EQ(error(), "w.safetensors holds 2 layer(s) of cell 'lstm', but 3 were asked for");
  options_.numLayers.reset();
  options_.bidirectional = false;
  EXPECT_EQ(error(), "w.safetensors holds bidirectional (_reverse) weights, but a one-direction "
                     "layer was asked for");
}

TEST_F(LayerErrors, InputRankAndFeatureSize) {
  request_.input = Tensor({3, 4});
  EXPECT_EQ(error(), "input has shape [3, 4], expected [B, T, input_size] (rank 3)");
  int64_t b = readNpyFloat32(kLayerFixtures + "lstm_l2_bi_bf/input.npy").dim(0);
  request_.input = Tensor({b, 2, 9});
  EXPECT_NE(error().find("input has shape [2, " + std::to_string(b) +
                         ", 9], expected [T, B, input_size]"),
            std::string::npos)
      << error();
}

TEST_F(LayerErrors, InitialStatesMustCoverEveryLayerAndDirection) {
  int64_t b = request_.input.dim(0);
  request_.initialStates["h"] = Tensor({1, b, 3});
  EXPECT_NE(error().find("initial state 'h' has shape [1, " + std::to_string(b) +
                         ", 3], expected [num_layers * num_directions, B, hidden_size] = [4, "),
            std::string::npos)
      << error();
}

TEST_F(LayerErrors, CellStateForACellWithoutOne) {
  weights_ = readSafeTensors(kLayerFixtures + "gru_l2_bi_bf_len/weights.safetensors");
  cell_ = frontend::loadCell("gru");
  request_.input = readNpyFloat32(kLayerFixtures + "gru_l2_bi_bf_len/input.npy");
  request_.initialStates["c"] = Tensor({4, request_.input.dim(0), 3});
  EXPECT_EQ(error(), "an initial value is given for 'c', but cell 'gru' has no state of that name");
}

TEST_F(LayerErrors, LengthsOutOfRangeOrOfTheWrongCount) {
  int64_t b = request_.input.dim(0), t = request_.input.dim(1);
  request_.lengths = Int64Array{{b + 1}, std::vector<int64_t>(static_cast<size_t>(b + 1), 1)};
  EXPECT_EQ(error(), "lengths has shape [" + std::to_string(b + 1) + "], expected [B] = [" +
                         std::to_string(b) + "] (one length per sequence of the batch)");
  request_.lengths = Int64Array{{b}, std::vector<int64_t>(static_cast<size_t>(b), 1)};
  request_.lengths->values[0] = t + 1;
  EXPECT_EQ(error(), "lengths[0] = " + std::to_string(t + 1) +
                         " is out of range: lengths must be in [1, T] = [1, " + std::to_string(t) +
                         "]");
  request_.lengths->values[0] = 0;
  EXPECT_NE(error().find("lengths[0] = 0 is out of range"), std::string::npos);
}

} // namespace

namespace {

// A cell whose sizes are bound already (as `rnnc bench` makes them) runs like an unbound one.
TEST(Layers, ACellWithBoundSizesRuns) {
  const std::string dir = kLayerFixtures + "lstm_l1_uni/";
  TensorMap weights = readSafeTensors(dir + "weights.safetensors");
  auto cell = frontend::loadCell("lstm");
  LayerRequest request;
  request.weights = &weights;
  request.input = readNpyFloat32(dir + "input.npy");
  request.initialStates["h"] = readNpyFloat32(dir + "h0.npy");
  request.initialStates["c"] = readNpyFloat32(dir + "c0.npy");
  Tensor expected = runLayers(*cell, request, {}).output;
  cell->bindSizes({{"input_size", weights.at("weight_ih_l0").dim(1)},
                   {"hidden_size", weights.at("weight_hh_l0").dim(1)}});
  EXPECT_EQ(runLayers(*cell, request, {}).output.values(), expected.values());
}

// runLayers reads the sizes from the tensors it is given too: a weightless cell's size from its
// input, another only its initial state shows from that state. Built without them, the
// program asks for the size by name.
TEST(Layers, SizesOnlyTheInputsOrStatesShowAreReadFromThem) {
  auto cell = frontend::parseCell(R"(cell accumulate(n, m) {
    input x[n]
    state s[n], k[m]
    return s = s + x, k = k; output s
  })",
                                  "accumulate.cell");
  TensorMap none;
  LayerRequest request;
  request.weights = &none;
  request.input = Tensor({3, 2, 4}, 1.0f);
  request.initialStates["k"] = Tensor({1, 2, 5}, 2.0f);
  LayerOptions options;
  options.engine = Engine::Interpreter;
  LayerResult result = runLayers(*cell, request, options);
  EXPECT_EQ(result.output.shape(), (TensorShape{3, 2, 4}));
  EXPECT_EQ(result.output.values().back(), 2.0f); // the state as a step starts: 0, 1, 2
  EXPECT_EQ(result.finalStates.at("s").values(), TensorData(8, 3.0f));
  EXPECT_EQ(result.finalStates.at("k").values(), TensorData(10, 2.0f));
  test::expectUserError(
      [&] { LayerProgram::build(*cell, none, "weights", options); },
      {"size 'n' of cell 'accumulate' appears in no tensor given", "--size n=VALUE"});
}

// A cell without parameters has no weights to count layers and directions from: it takes those
// asked for (it ran as one layer, one direction, and refused any other).
TEST(Layers, ACellWithoutParametersStacksAndRunsBothDirections) {
  auto cell = frontend::parseCell(R"(cell accumulate(n) {
    input x[n]
    state s[n]
    s2 = s + x
    return s = s2; output s2
  })",
                                  "accumulate.cell");
  TensorMap none;
  LayerRequest request;
  request.weights = &none;
  request.input = Tensor({3, 1, 1}, 1.0f);
  for (Engine engine : {Engine::Interpreter, Engine::Jit}) {
    LayerOptions options;
    options.engine = engine;
    options.numLayers = 2; // the running sums of the running sums of ones
    LayerResult stacked = runLayers(*cell, request, options);
    EXPECT_EQ(stacked.output.values(), (TensorData{1, 3, 6}));
    EXPECT_EQ(stacked.finalStates.at("s").values(), (TensorData{3, 6}));
    options.numLayers = 1;
    options.bidirectional = true; // [forward | reverse] per step: sums from the start, the end
    LayerResult both = runLayers(*cell, request, options);
    EXPECT_EQ(both.output.values(), (TensorData{1, 3, 2, 2, 3, 1}));
    EXPECT_EQ(both.finalStates.at("s").values(), (TensorData{3, 3}));
  }
}

} // namespace

namespace {

LayerResult runFixture(const std::string& name, const LayerOptions& options) {
  const std::string dir = kLayerFixtures + name + "/";
  TensorMap weights = readSafeTensors(dir + "weights.safetensors");
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir + "meta.json"));
  auto cell = frontend::loadCell(meta["mode"].get<std::string>());
  LayerRequest request;
  request.weights = &weights;
  request.input = readNpyFloat32(dir + "input.npy");
  LayerOptions o = options;
  o.batchFirst = meta["batch_first"].get<bool>();
  return runLayers(*cell, request, o);
}

TEST(Layers, DropoutBetweenLayersIsSeededAndOnlyInTraining) {
  LayerOptions options;
  options.dropout = 0.5;
  Tensor inference = runFixture("gru_l3_uni_len", options).output;
  options.dropout = 0;
  EXPECT_EQ(runFixture("gru_l3_uni_len", options).output.values(), inference.values())
      << "inference ignores dropout";

  options.dropout = 0.5;
  options.training = true;
  options.seed = 1;
  Tensor first = runFixture("gru_l3_uni_len", options).output;
  EXPECT_EQ(runFixture("gru_l3_uni_len", options).output.values(), first.values())
      << "the same seed gives the same masks";
  EXPECT_NE(first.values(), inference.values());
  options.seed = 2;
  EXPECT_NE(runFixture("gru_l3_uni_len", options).output.values(), first.values());
}

TEST(Layers, NoDropoutAfterTheLastLayer) {
  LayerOptions options;
  Tensor inference = runFixture("gru_l2_uni", options).output;
  options.training = true;
  options.dropout = 0.9;
  options.numLayers = 2;
  LayerResult trained = runFixture("gru_l2_uni", options);
  // Layer 0's output is dropped before layer 1, so the output differs...
  EXPECT_NE(trained.output.values(), inference.values());
  // ...but a single layer has no layer after it to drop for.
  Tensor single = runFixture("gru_l1_uni_len", LayerOptions{}).output;
  options.numLayers = 1;
  EXPECT_EQ(runFixture("gru_l1_uni_len", options).output.values(), single.values());
}

} // namespace

namespace {

// Variable length on the JIT premultiplies every packed row at once, then runs each stretch of
// steps on its rows of the pre buffers; the interpreter runs stretch by stretch. Both must
// agree for cells with hoisted work beyond a GEMM (layer norms, peepholes), and with the input
// projection kept in the loop.
TEST(Layers, PackedVariableLengthOnTheJitMatchesTheInterpreter) {
  std::mt19937 rng(7);
  const int64_t steps = 9, batch = 6;
  Int64Array lengths{{batch}, {3, 9, 1, 9, 5, 3}};
  for (const char* name : {"lstm", "gru", "rnn_tanh", "lnlstm", "peephole_lstm"})
    for (bool premultiply : {true, false}) {
      SCOPED_TRACE(std::string(name) + (premultiply ? "" : " --no-premul"));
      auto cell = frontend::loadCell(name);
      TensorMap weights = test::randomWeights(*cell, {{"input_size", 5}, {"hidden_size", 7}}, rng);
      LayerRequest request;
      request.weights = &weights;
      request.input = test::randomTensor({steps, batch, 5}, rng, 1.0f);
      for (const auto& state : cell->states)
        request.initialStates[state->name] = test::randomTensor({1, batch, 7}, rng);
      request.lengths = lengths;
      LayerOptions interpreted;
      interpreted.engine = Engine::Interpreter;
      LayerOptions jit;
      jit.compile.pipeline.premultiply = premultiply;
      LayerResult expected = runLayers(*cell, request, interpreted);
      LayerResult actual = runLayers(*cell, request, jit);
      EXPECT_LT(test::maxAbsDiff(actual.output, expected.output), 1e-5f);
      for (const auto& [state, value] : expected.finalStates)
        EXPECT_LT(test::maxAbsDiff(actual.finalStates.at(state), value), 1e-5f) << state;
    }
}

} // namespace

// Weight layouts: MIOpen's gate order and flat buffers, converted to PyTorch's state_dict and
// run against the PyTorch layer fixtures.
#include "frontend/BuiltinCells.h"
#include "ir/Error.h"
#include "runtime/data/Npy.h"
#include "runtime/data/WeightLayouts.h"
#include "runtime/layers/LayerRunner.h"

#include "tests/TestSupport.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

using namespace rnnc;

namespace {

struct Fixture {
  nlohmann::json meta;
  TensorMap weights;
  std::string mode() const {
    return meta["proj_size"].get<int>() > 0 ? "lstm_proj" : meta["mode"].get<std::string>();
  }
  FlatLayout layout() const {
    return {mode(),
            meta["input_size"],
            meta["hidden_size"],
            meta["proj_size"],
            meta["num_layers"],
            meta["bidirectional"]};
  }
};

Fixture load(const std::string& name) {
  return {nlohmann::json::parse(std::ifstream(test::kLayerFixtures + name + "/meta.json")),
          readSafeTensors(test::kLayerFixtures + name + "/weights.safetensors")};
}

using test::maxAbsDiff;

// Runs the fixture with `weights` in place of its own and compares with PyTorch's output.
void expectFixtureOutput(const std::string& name, const TensorMap& weights) {
  Fixture f = load(name);
  auto cell = frontend::loadCell(f.mode());
  LayerRequest request;
  request.weights = &weights;
  request.input = readNpyFloat32(test::kLayerFixtures + name + "/input.npy");
  request.initialStates["h"] = readNpyFloat32(test::kLayerFixtures + name + "/h0.npy");
  if (f.meta["mode"] == "lstm")
    request.initialStates["c"] = readNpyFloat32(test::kLayerFixtures + name + "/c0.npy");
  if (f.meta["has_lengths"].get<bool>())
    request.lengths = readNpyInt64(test::kLayerFixtures + name + "/lengths.npy");
  LayerOptions options;
  options.batchFirst = f.meta["batch_first"];
  EXPECT_LE(maxAbsDiff(runLayers(*cell, request, options).output,
                       readNpyFloat32(test::kLayerFixtures + name + "/output.npy")),
            1e-5f);
}

TEST(MIOpenGateOrder, LstmTradesTheCellAndOutputGates) {
  Fixture f = load("lstm_l2_bi_bf");
  TensorMap miopen = swapMIOpenGateOrder(f.weights, "lstm");
  const Tensor& canonical = f.weights.at("weight_ih_l1_reverse");
  const Tensor& swapped = miopen.at("weight_ih_l1_reverse");
  const int64_t block = canonical.numel() / 4; // one gate's rows
  EXPECT_TRUE(std::equal(canonical.data() + 3 * block, canonical.data() + 4 * block,
                         swapped.data() + 2 * block)); // o moved to where g was
  EXPECT_TRUE(std::equal(canonical.data(), canonical.data() + 2 * block, swapped.data()));
  EXPECT_GT(maxAbsDiff(canonical, swapped), 0.0f);
  expectFixtureOutput("lstm_l2_bi_bf", swapMIOpenGateOrder(miopen, "lstm"));
}

TEST(MIOpenGateOrder, GruTradesTheResetAndUpdateGatesAndLeavesProjectionsAlone) {
  Fixture gru = load("gru_l2_bi_bf_len");
  TensorMap miopen = swapMIOpenGateOrder(gru.weights, "gru");
  const Tensor& canonical = gru.weights.at("bias_hh_l0");
  const int64_t h = canonical.numel() / 3;
  EXPECT_EQ(miopen.at("bias_hh_l0").data()[0], canonical.data()[h]);
  expectFixtureOutput("gru_l2_bi_bf_len", swapMIOpenGateOrder(miopen, "gru"));

  Fixture proj = load("lstm_proj_l2_bi");
  TensorMap swapped = swapMIOpenGateOrder(proj.weights, "lstm_proj");
  EXPECT_EQ(swapped.at("weight_hr_l0").values(), proj.weights.at("weight_hr_l0").values());
  EXPECT_THROW(swapMIOpenGateOrder(proj.weights, "peephole_lstm"), UserError);
}

class FlatWeights : public testing::TestWithParam<std::string> {};

TEST_P(FlatWeights, RoundTripAndRunAsPyTorch) {
  Fixture f = load(GetParam());
  Tensor flat = flattenWeights(f.weights, f.layout());
  TensorMap back = unflattenWeights(flat, f.layout(), "flat.npy");
  ASSERT_EQ(back.size(), f.weights.size());
  for (const auto& [name, tensor] : f.weights)
    EXPECT_EQ(back.at(name).values(), tensor.values()) << name;
  expectFixtureOutput(GetParam(), back);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FlatWeights,
                         testing::Values("lstm_l3_bi_len", "gru_l2_bi_bf_len",
                                         "rnn_relu_l2_uni_len", "lstm_proj_l2_bi_bf_len"));

TEST(FlatWeightsErrors, ASizeThatDoesNotMatchTheLayoutIsNamed) {
  FlatLayout layout{"gru", 3, 4, 0, 2, true};
  try {
    unflattenWeights(Tensor({10}), layout, "w.npy");
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "w.npy: flat weights have shape [10], expected [552] for 2 layer(s) of gru in both "
              "directions with input_size 3, hidden_size 4");
  }
}

} // namespace

// `rnnc run` on whole layers: the layer flags, flat and MIOpen-ordered weights, through the real
// binary, against the PyTorch layer fixtures.
#include "runtime/data/Npy.h"
#include "runtime/data/WeightLayouts.h"
#include "tests/TestSupport.h"
#include "tests/ToolRunner.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

using namespace rnnc;

namespace {

class ToolLayers : public test::ScratchDirTest {
protected:
  // rnnc run on fixture `name` with `extra` arguments (weights included); returns max |diff|
  // of the output against PyTorch's.
  float runAndCompare(const std::string& name, std::vector<std::string> extra) {
    const std::string dir = test::kLayerFixtures + name + "/";
    nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir + "meta.json"));
    std::vector<std::string> args = {"run",          "--cell",          meta["mode"],
                                     "--input",      dir + "input.npy", "--h0",
                                     dir + "h0.npy", "--output",        path("out.npy")};
    if (meta["mode"] == "lstm")
      args.insert(args.end(), {"--c0", dir + "c0.npy"});
    if (meta["batch_first"].get<bool>())
      args.push_back("--batch-first");
    if (meta["has_lengths"].get<bool>())
      args.insert(args.end(), {"--lengths", dir + "lengths.npy"});
    args.insert(args.end(), extra.begin(), extra.end());
    test::ToolResult r = test::ToolRunner(dir_).run(args);
    EXPECT_EQ(r.exitCode, 0) << r;
    if (r.exitCode != 0)
      return 1e9f;
    Tensor got = readNpyFloat32(path("out.npy")), want = readNpyFloat32(dir + "output.npy");
    EXPECT_EQ(got.shape(), want.shape());
    float worst = 0;
    for (int64_t i = 0; i < std::min(got.numel(), want.numel()); ++i)
      worst = test::worseOf(worst, std::abs(got.data()[i] - want.data()[i]));
    return worst;
  }
};

TEST_F(ToolLayers, LayerFlagsMatchPyTorch) {
  EXPECT_LE(runAndCompare("lstm_l3_bi_len",
                          {"--weights", test::kLayerFixtures + "lstm_l3_bi_len/weights.safetensors",
                           "--num-layers", "3", "--bidirectional"}),
            1e-5f);
  EXPECT_LE(runAndCompare("lstm_proj_l2_bi_bf_len",
                          {"--weights",
                           test::kLayerFixtures + "lstm_proj_l2_bi_bf_len/weights.safetensors",
                           "--proj-size", "2"}),
            1e-5f);
}

TEST_F(ToolLayers, FlatWeightsMatchPyTorch) {
  const std::string name = "gru_l2_bi_bf_len";
  nlohmann::json meta =
      nlohmann::json::parse(std::ifstream(test::kLayerFixtures + name + "/meta.json"));
  FlatLayout layout{"gru", meta["input_size"], meta["hidden_size"], 0, 2, true};
  writeNpy(path("flat.npy"),
           flattenWeights(readSafeTensors(test::kLayerFixtures + name + "/weights.safetensors"),
                          layout));
  EXPECT_LE(
      runAndCompare(name, {"--flat-weights", path("flat.npy"), "--size",
                           "input_size=" + std::to_string(meta["input_size"].get<int>()), "--size",
                           "hidden_size=" + std::to_string(meta["hidden_size"].get<int>()),
                           "--num-layers", "2", "--bidirectional"}),
      1e-5f);
}

TEST_F(ToolLayers, MIOpenGateOrderMatchesPyTorch) {
  const std::string name = "lstm_l2_uni_len";
  writeSafeTensors(
      path("miopen.safetensors"),
      swapMIOpenGateOrder(readSafeTensors(test::kLayerFixtures + name + "/weights.safetensors"),
                          "lstm"));
  EXPECT_LE(
      runAndCompare(name, {"--weights", path("miopen.safetensors"), "--weight-layout", "miopen"}),
      1e-5f);
}

// PyTorch's state_dicts as people have them: a bias=False module (no bias_* tensors), and an
// RNN inside a whole model (self.rnn: rnn.weight_ih_l0, ..., beside fc.weight).
TEST_F(ToolLayers, BiasFreeWeightsAndASubmodulesWeightsMatchPyTorch) {
  for (const char* name : {"lstm_l2_bi_nobias", "gru_l1_uni_len_nobias", "lstm_proj_l1_uni_nobias"})
    EXPECT_LE(
        runAndCompare(name, {"--weights", test::kLayerFixtures + name + "/weights.safetensors"}),
        1e-5f)
        << name;
  const std::string name = "lstm_l2_bi_bf";
  TensorMap model;
  for (const auto& [key, tensor] :
       readSafeTensors(test::kLayerFixtures + name + "/weights.safetensors"))
    model["rnn." + key] = tensor;
  model["fc.weight"] = Tensor({3, 10});
  writeSafeTensors(path("model.safetensors"), model);
  EXPECT_LE(
      runAndCompare(name, {"--weights", path("model.safetensors"), "--weights-prefix", "rnn."}),
      1e-5f);
  test::ToolRunner tool(dir_);
  test::ToolResult r =
      tool.run({"run", "--cell", "lstm", "--weights", path("model.safetensors"), "--weights-prefix",
                "rnn.", "--input", test::kLayerFixtures + name + "/input.npy", "--batch-first",
                "--output", path("out.npy")});
  EXPECT_EQ(r.exitCode, 0) << r;
  EXPECT_NE(r.err.find("note: " + path("model.safetensors") +
                       ": ignoring 1 tensor outside 'rnn.' (fc.weight)"),
            std::string::npos)
      << r;
  r = tool.run({"run", "--cell", "lstm", "--weights", path("model.safetensors"), "--weights-prefix",
                "encoder.", "--input", test::kLayerFixtures + name + "/input.npy", "--output",
                path("out.npy")});
  EXPECT_EQ(r.exitCode, 1) << r;
  EXPECT_NE(r.err.find("no tensor's name starts with the weights prefix 'encoder.'"),
            std::string::npos)
      << r;
}

TEST_F(ToolLayers, ANumberOfLayersBelowOneIsAnError) {
  const std::string dir = test::kLayerFixtures + "lstm_l2_bi_bf/";
  for (const char* layers : {"0", "-1"}) {
    test::ToolResult r = test::ToolRunner(dir_).run(
        {"run", "--cell", "lstm", "--weights", dir + "weights.safetensors", "--input",
         dir + "input.npy", "--batch-first", "--num-layers", layers, "--output", path("out.npy")});
    EXPECT_EQ(r.exitCode, 1) << r;
    EXPECT_NE(r.err.find(std::string("--num-layers must be at least 1, got ") + layers),
              std::string::npos)
        << r;
  }
}

TEST_F(ToolLayers, ANegativeThreadCountIsAnError) {
  const std::string dir = test::kLayerFixtures + "lstm_l2_bi_bf/";
  for (const char* command : {"run", "grad"}) {
    std::vector<std::string> args = {command,
                                     "--cell",
                                     "lstm",
                                     "--weights",
                                     dir + "weights.safetensors",
                                     "--input",
                                     dir + "input.npy",
                                     "--batch-first",
                                     "--num-layers",
                                     "2",
                                     "--bidirectional",
                                     "--threads",
                                     "-1"};
    if (std::string(command) == "run")
      args.insert(args.end(), {"--output", path("out.npy")});
    else
      args.insert(args.end(), {"--grads", path("grads.safetensors")});
    test::ToolResult r = test::ToolRunner(dir_).run(args);
    EXPECT_EQ(r.exitCode, 1) << r;
    EXPECT_NE(r.err.find("--threads must be 0 (automatic) or positive, got -1"), std::string::npos)
        << r;
  }
}

TEST_F(ToolLayers, BadLayerInputIsACleanError) {
  const std::string dir = test::kLayerFixtures + "lstm_l2_bi_bf/";
  test::ToolRunner tool(dir_);
  test::ToolResult r = tool.run({"run", "--cell", "lstm", "--weights", dir + "weights.safetensors",
                                 "--input", dir + "input.npy", "--batch-first", "--num-layers", "3",
                                 "--output", path("out.npy")});
  EXPECT_EQ(r.exitCode, 1) << r;
  EXPECT_NE(r.err.find("holds 2 layer(s) of cell 'lstm', but 3 were asked for"), std::string::npos)
      << r;
  r = tool.run({"run", "--cell", "lstm", "--flat-weights", path("missing.npy"), "--input",
                dir + "input.npy", "--output", path("out.npy")});
  EXPECT_EQ(r.exitCode, 1) << r;
  EXPECT_NE(r.err.find("--flat-weights needs the layout"), std::string::npos) << r;
}

} // namespace

// The public C++ API (include/rnnc/rnnc.h): PyTorch numerics through caller-owned buffers,
// concurrent forward calls on one layer, and its errors.
#include "rnnc/rnnc.h"
#include "runtime/data/Npy.h"
#include "runtime/gpu/CudaDriver.h"

#include "tests/TestSupport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <thread>

#include <unistd.h>

namespace {

rnnc::LayerSpec spec(const std::string& cell) {
  rnnc::LayerSpec s;
  s.cell = cell;
  return s;
}

template <class A, class B> double maxAbsDiff(const A& a, const B& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = rnnc::test::worseOf(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

const std::string kBidirectionalLstm = rnnc::test::kLayerFixtures + "lstm_l1_bi_bf_len/";

// A layer built with `spec` (batch_first) on the bidirectional LSTM fixture with lengths gives
// PyTorch's outputs and final states through caller-owned buffers.
void expectPyTorchsBidirectionalLstm(const rnnc::LayerSpec& spec) {
  const std::string& dir = kBidirectionalLstm;
  rnnc::Layer layer = rnnc::Layer::fromFile(spec, dir + "weights.safetensors");
  EXPECT_EQ(layer.numDirections(), 2);
  rnnc::Tensor x = rnnc::readNpyFloat32(dir + "input.npy"); // [B, T, I]
  rnnc::Tensor h0 = rnnc::readNpyFloat32(dir + "h0.npy"), c0 = rnnc::readNpyFloat32(dir + "c0.npy");
  rnnc::Int64Array lengths = rnnc::readNpyInt64(dir + "lengths.npy");
  const int64_t batch = x.dim(0), steps = x.dim(1);
  ASSERT_EQ(layer.inputSize(), x.dim(2));
  std::vector<float> y(static_cast<size_t>(steps * batch * layer.outputSize()));
  std::vector<float> hn(h0.values().size()), cn(c0.values().size());
  layer.forward(x.data(), steps, batch, h0.data(), c0.data(), lengths.values.data(), y.data(),
                hn.data(), cn.data());
  EXPECT_LE(maxAbsDiff(y, rnnc::readNpyFloat32(dir + "output.npy").values()), 1e-5f);
  EXPECT_LE(maxAbsDiff(hn, rnnc::readNpyFloat32(dir + "hn.npy").values()), 1e-5f);
  EXPECT_LE(maxAbsDiff(cn, rnnc::readNpyFloat32(dir + "cn.npy").values()), 1e-5f);
}

TEST(Api, ABidirectionalBatchFirstLstmWithLengthsMatchesPyTorch) {
  for (int threads : {0, 1, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    rnnc::LayerSpec spec;
    spec.batchFirst = true;
    spec.threads = threads;
    expectPyTorchsBidirectionalLstm(spec);
  }
}

// LayerSpec::device: the GPU's kernels emulated on this CPU give PyTorch's results through the
// same call; an unknown device, and "cuda" without a GPU, are errors when the layer is built.
TEST(Api, DeviceOption) {
  rnnc::LayerSpec emulated;
  emulated.batchFirst = true;
  emulated.device = "cuda-emulated";
  expectPyTorchsBidirectionalLstm(emulated);
  const std::string weights = kBidirectionalLstm + "weights.safetensors";
  rnnc::LayerSpec unknown = emulated;
  unknown.device = "tpu";
  EXPECT_THROW(rnnc::Layer::fromFile(unknown, weights), std::runtime_error);
  rnnc::LayerSpec cuda = emulated;
  cuda.device = "cuda";
  if (!rnnc::CudaDriver::unavailableReason().empty()) {
    EXPECT_THROW(rnnc::Layer::fromFile(cuda, weights), std::runtime_error);
  }
}

TEST(Api, ConcurrentForwardCallsOnOneLayerAgree) {
  const std::string dir = rnnc::test::kLayerFixtures + "gru_l3_uni_len/";
  rnnc::Layer layer = rnnc::Layer::fromFile(spec("gru"), dir + "weights.safetensors");
  rnnc::Tensor x = rnnc::readNpyFloat32(dir + "input.npy");
  const int64_t steps = x.dim(0), batch = x.dim(1);
  auto forward = [&] {
    std::vector<float> y(static_cast<size_t>(steps * batch * layer.outputSize()));
    layer.forward(x.data(), steps, batch, nullptr, nullptr, nullptr, y.data(), nullptr, nullptr);
    return y;
  };
  std::vector<float> reference = forward();
  std::vector<std::vector<float>> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results)
    threads.emplace_back([&] {
      for (int i = 0; i < 5; ++i)
        r = forward();
    });
  for (auto& t : threads)
    t.join();
  for (const auto& r : results)
    EXPECT_EQ(r, reference);
}

// Layers of different cells built at once from several threads (compiling, caching and lending
// thread teams concurrently), each running on two threads, against the same layers built alone.
TEST(Api, LayersBuiltAndRunFromSeveralThreadsAtOnceAgree) {
  const std::vector<std::pair<std::string, std::string>> layers = {
      {"lstm", "lstm_l1_uni"}, {"gru", "gru_l3_uni_len"}, {"rnn_relu", "rnn_relu_l1_uni"}};
  auto buildAndRun = [&](const std::pair<std::string, std::string>& which) {
    rnnc::LayerSpec s = spec(which.first);
    s.threads = 2;
    const std::string dir = rnnc::test::kLayerFixtures + which.second + "/";
    rnnc::Layer layer = rnnc::Layer::fromFile(s, dir + "weights.safetensors");
    rnnc::Tensor x = rnnc::readNpyFloat32(dir + "input.npy");
    std::vector<float> y(static_cast<size_t>(x.dim(0) * x.dim(1) * layer.outputSize()));
    layer.forward(x.data(), x.dim(0), x.dim(1), nullptr, nullptr, nullptr, y.data(), nullptr,
                  nullptr);
    return y;
  };
  // An empty disk cache, so that the threads compile (the memory cache is per process).
  const char* saved = std::getenv("RNNC_CACHE_DIR");
  const std::string savedDir = saved ? saved : "";
  const std::string cacheDir = testing::TempDir() + "rnnc_api_threads_" + std::to_string(getpid());
  std::filesystem::remove_all(cacheDir);
  setenv("RNNC_CACHE_DIR", cacheDir.c_str(), 1);
  std::vector<std::vector<float>> results(2 * layers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] { results[i] = buildAndRun(layers[i % layers.size()]); });
  for (auto& t : threads)
    t.join();
  std::vector<std::vector<float>> reference;
  for (const auto& which : layers)
    reference.push_back(buildAndRun(which));
  if (saved)
    setenv("RNNC_CACHE_DIR", savedDir.c_str(), 1);
  else
    unsetenv("RNNC_CACHE_DIR");
  std::filesystem::remove_all(cacheDir);
  for (size_t i = 0; i < results.size(); ++i)
    EXPECT_EQ(results[i], reference[i % layers.size()]) << layers[i % layers.size()].first;
}

// LayerSpec::weightsDtype: bf16 and fp16 weights within 1e-2 of the fp32 layer, fp16 closer.
TEST(Api, ReducedWeightsStayCloseToFp32) {
  const std::string dir = rnnc::test::kLayerFixtures + "gru_l2_uni/";
  rnnc::Tensor x = rnnc::readNpyFloat32(dir + "input.npy");
  auto forward = [&](const std::string& dtype) {
    rnnc::LayerSpec s = spec("gru");
    s.weightsDtype = dtype;
    rnnc::Layer layer = rnnc::Layer::fromFile(s, dir + "weights.safetensors");
    std::vector<float> y(static_cast<size_t>(x.dim(0) * x.dim(1) * layer.outputSize()));
    layer.forward(x.data(), x.dim(0), x.dim(1), nullptr, nullptr, nullptr, y.data(), nullptr,
                  nullptr);
    return y;
  };
  std::vector<float> fp32 = forward("fp32");
  const float largest = std::abs(*std::max_element(
      fp32.begin(), fp32.end(), [](float a, float b) { return std::abs(a) < std::abs(b); }));
  const float bf16 = maxAbsDiff(forward("bf16"), fp32) / largest;
  const float fp16 = maxAbsDiff(forward("fp16"), fp32) / largest;
  EXPECT_GT(bf16, 0.0f);
  EXPECT_LT(bf16, 1e-2f);
  EXPECT_LT(fp16, bf16);
  rnnc::LayerSpec bad = spec("gru");
  bad.weightsDtype = "half";
  try {
    rnnc::Layer::fromFile(bad, dir + "weights.safetensors");
    ADD_FAILURE() << "an unknown dtype was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown weights dtype 'half'"), std::string::npos);
  }
}

TEST(Api, WeightsFromMemoryAndClearErrors) {
  std::map<std::string, rnnc::WeightTensor> weights = {
      {"weight_ih_l0", {{2, 3}, std::vector<float>(6, 0.1f)}},
      {"weight_hh_l0", {{2, 2}, std::vector<float>(4, -0.1f)}},
      {"bias_ih_l0", {{2}, {0.0f, 0.5f}}},
      {"bias_hh_l0", {{2}, {0.25f, 0.0f}}}};
  rnnc::Layer layer = rnnc::Layer::fromWeights(spec("rnn_tanh"), weights);
  EXPECT_EQ(layer.inputSize(), 3);
  EXPECT_EQ(layer.outputSize(), 2);
  std::vector<float> x = {1, 2, 3}, y(2);
  layer.forward(x.data(), 1, 1, nullptr, nullptr, nullptr, y.data(), nullptr, nullptr);
  EXPECT_NEAR(y[0], std::tanh(0.6 + 0.25), 1e-6);
  EXPECT_NEAR(y[1], std::tanh(0.6 + 0.5), 1e-6);

  std::vector<float> c0(2);
  EXPECT_THROW(
      layer.forward(x.data(), 1, 1, nullptr, c0.data(), nullptr, y.data(), nullptr, nullptr),
      std::runtime_error);
  weights["weight_hh_l0"].values.pop_back();
  try {
    rnnc::Layer::fromWeights(spec("rnn_tanh"), weights);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "weight 'weight_hh_l0' has shape [2, 2] but 3 values");
  }
}

// LayerSpec::weightsPrefix: a submodule's tensors out of a whole model's state_dict, the other
// tensors ignored; no tensor with the prefix is an error listing the names.
TEST(Api, WeightsPrefixTakesASubmodule) {
  std::map<std::string, rnnc::WeightTensor> model = {
      {"encoder.rnn.weight_ih_l0", {{2, 3}, std::vector<float>(6, 0.1f)}},
      {"encoder.rnn.weight_hh_l0", {{2, 2}, std::vector<float>(4, -0.1f)}},
      {"encoder.rnn.bias_ih_l0", {{2}, {0.0f, 0.5f}}},
      {"encoder.rnn.bias_hh_l0", {{2}, {0.25f, 0.0f}}},
      {"decoder.weight", {{4, 4}, std::vector<float>(16, 1.0f)}}};
  rnnc::LayerSpec s = spec("rnn_tanh");
  s.weightsPrefix = "encoder.rnn.";
  rnnc::Layer layer = rnnc::Layer::fromWeights(s, model);
  std::vector<float> x = {1, 2, 3}, y(2);
  layer.forward(x.data(), 1, 1, nullptr, nullptr, nullptr, y.data(), nullptr, nullptr);
  EXPECT_NEAR(y[0], std::tanh(0.6 + 0.25), 1e-6);
  EXPECT_NEAR(y[1], std::tanh(0.6 + 0.5), 1e-6);
  s.weightsPrefix = "decoder.rnn.";
  try {
    rnnc::Layer::fromWeights(s, model);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'decoder.rnn.'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("decoder.weight"), std::string::npos) << e.what();
  }
}

} // namespace

namespace {

// LSTMCell/GRUCell/RNNCell: one step equals the first step of the matching one-layer fixture.
class CellStepTest : public testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(CellStepTest, MatchesTheFirstStepOfTheLayer) {
  const auto& [cell, fixture] = GetParam();
  const std::string dir = rnnc::test::kLayerFixtures + fixture + "/";
  rnnc::CellStep step = rnnc::CellStep::fromFile(cell, dir + "weights.safetensors");
  rnnc::Tensor x = rnnc::readNpyFloat32(dir + "input.npy"); // [T, B, I], not batch_first
  rnnc::Tensor h0 = rnnc::readNpyFloat32(dir + "h0.npy");   // [1, B, H]
  const int64_t batch = x.dim(1), hidden = step.stateSize("h");
  bool hasC = cell == "lstm";
  rnnc::Tensor c0 = hasC ? rnnc::readNpyFloat32(dir + "c0.npy") : rnnc::Tensor();
  std::vector<float> h1(static_cast<size_t>(batch * hidden)), c1(h1.size());
  step.step(x.data(), batch, h0.data(), hasC ? c0.data() : nullptr, h1.data(),
            hasC ? c1.data() : nullptr);
  rnnc::Tensor output = rnnc::readNpyFloat32(dir + "output.npy"); // step 0 is h1
  std::vector<float> expected(output.data(), output.data() + batch * hidden);
  EXPECT_LE(maxAbsDiff(h1, expected), 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Cells, CellStepTest,
                         testing::Values(std::pair{"lstm", "lstm_l1_uni"},
                                         std::pair{"gru", "gru_l1_uni_len"},
                                         std::pair{"rnn_relu", "rnn_relu_l1_uni"}),
                         [](const auto& info) { return info.param.first; });

} // namespace

namespace {

// PyTorch's packed form, built from a padded fixture the way pack_padded_sequence(
// enforce_sorted=False) builds it.
TEST(Api, PackedSequencesMatchPyTorch) {
  const std::string dir = rnnc::test::kLayerFixtures + "lstm_l2_uni_len/";
  rnnc::Layer layer = rnnc::Layer::fromFile(rnnc::LayerSpec{}, dir + "weights.safetensors");
  rnnc::Tensor x = rnnc::readNpyFloat32(dir + "input.npy"); // [T, B, I]
  rnnc::Tensor y = rnnc::readNpyFloat32(dir + "output.npy");
  std::vector<int64_t> lengths = rnnc::readNpyInt64(dir + "lengths.npy").values;
  const int64_t steps = x.dim(0), batch = x.dim(1), in = x.dim(2), out = y.dim(2);
  std::vector<int64_t> sorted(static_cast<size_t>(batch));
  std::iota(sorted.begin(), sorted.end(), 0);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<int64_t> batchSizes;
  std::vector<float> data, expected;
  for (int64_t t = 0; t < steps; ++t) {
    int64_t active = 0;
    for (int64_t b : sorted)
      if (lengths[b] > t) {
        ++active;
        data.insert(data.end(), x.data() + (t * batch + b) * in,
                    x.data() + (t * batch + b + 1) * in);
        expected.insert(expected.end(), y.data() + (t * batch + b) * out,
                        y.data() + (t * batch + b + 1) * out);
      }
    if (active > 0)
      batchSizes.push_back(active);
  }
  rnnc::Tensor h0 = rnnc::readNpyFloat32(dir + "h0.npy"), c0 = rnnc::readNpyFloat32(dir + "c0.npy");
  std::vector<float> packedOut(expected.size()), hn(h0.values().size()), cn(c0.values().size());
  layer.forwardPacked(data.data(), batchSizes.data(), static_cast<int64_t>(batchSizes.size()),
                      sorted.data(), h0.data(), c0.data(), packedOut.data(), hn.data(), cn.data());
  EXPECT_LE(maxAbsDiff(packedOut, expected), 1e-5f);
  EXPECT_LE(maxAbsDiff(hn, rnnc::readNpyFloat32(dir + "hn.npy").values()), 1e-5f);
  EXPECT_LE(maxAbsDiff(cn, rnnc::readNpyFloat32(dir + "cn.npy").values()), 1e-5f);

  std::vector<int64_t> growing = {1, 2};
  EXPECT_THROW(layer.forwardPacked(data.data(), growing.data(), 2, nullptr, nullptr, nullptr,
                                   packedOut.data(), nullptr, nullptr),
               std::runtime_error);
  std::vector<int64_t> notAPermutation(static_cast<size_t>(batch), 0);
  EXPECT_THROW(layer.forwardPacked(data.data(), batchSizes.data(),
                                   static_cast<int64_t>(batchSizes.size()), notAPermutation.data(),
                                   nullptr, nullptr, packedOut.data(), nullptr, nullptr),
               std::runtime_error);
}

// The memory kept for reuse: a layer's packed weights (8 MB for an LSTM of 512) are kept when it
// goes; releasing returns them, and a limit of zero keeps none.
TEST(Api, CachedMemoryIsKeptWithinItsLimitAndReleasedOnRequest) {
  const size_t limit = rnnc::cachedMemoryLimit();
  rnnc::releaseCachedMemory();
  auto buildAndRun = [] {
    std::map<std::string, rnnc::WeightTensor> weights;
    for (const char* name : {"weight_ih_l0", "weight_hh_l0"})
      weights[name] = {{2048, 512}, std::vector<float>(2048 * 512, 0.01f)};
    for (const char* name : {"bias_ih_l0", "bias_hh_l0"})
      weights[name] = {{2048}, std::vector<float>(2048, 0.0f)};
    rnnc::Layer layer = rnnc::Layer::fromWeights(spec("lstm"), weights);
    std::vector<float> x(2 * 512, 1.0f), y(2 * 512), hn(512), cn(512);
    layer.forward(x.data(), 2, 1, nullptr, nullptr, nullptr, y.data(), hn.data(), cn.data());
    return y[0];
  };
  const float y = buildAndRun();
  const size_t kept = rnnc::cachedMemoryBytes();
  EXPECT_GE(kept, size_t{8} << 20) << "the layer's packed weights were not kept";
  EXPECT_EQ(rnnc::releaseCachedMemory(), kept);
  EXPECT_EQ(rnnc::cachedMemoryBytes(), 0u);
  rnnc::setCachedMemoryLimit(0);
  EXPECT_EQ(buildAndRun(), y);
  EXPECT_EQ(rnnc::cachedMemoryBytes(), 0u);
  EXPECT_EQ(rnnc::cachedMemoryLimit(), 0u);
  rnnc::setCachedMemoryLimit(limit);
  EXPECT_EQ(rnnc::cachedMemoryLimit(), limit);
}

} // namespace

namespace {

// A cell whose state is neither h nor c, with a side input: through the API by name, its results
// and gradients against the recurrence written out by hand. s' = s * w + x * ctx; for
// loss = sum(y * dy) + sum(s_T * ds), g_t = dL/ds_t = dy_t + w * g_{t+1} (g_T = dy_T + ds), so
// dL/dx_t = g_t ctx_t, dL/dctx_t = g_t x_t, dL/ds_0 = w g_1 and dL/dw = sum over t and rows of
// g_t s_{t-1}.
class NamedBuffers : public rnnc::test::ScratchDirTest {};

TEST_F(NamedBuffers, AnyCellsStatesAndSideInputsTrainByName) {
  const std::string cell = writeBytes("scale.cell", R"(cell scale(n) {
  input x[n], ctx[n]
  state s[n]
  param w[n]
  s2 = s * w + x * ctx
  return s = s2; output s2
})");
  const int64_t steps = 4, batch = 2, n = 3, rows = batch * n;
  std::vector<float> w = {0.9f, -0.5f, 1.1f}, x(steps * rows), ctx(steps * rows), s0(rows),
                     dy(steps * rows), ds(rows);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.7f * i);
    ctx[i] = std::cos(0.3f * i);
    dy[i] = std::sin(1.3f * i + 0.5f);
  }
  for (int64_t i = 0; i < rows; ++i) {
    s0[i] = 0.2f * i - 0.4f;
    ds[i] = 1.0f - 0.3f * i;
  }
  // By hand: the states, then the gradients backwards in time.
  std::vector<double> s((steps + 1) * rows), g(steps * rows), dx(x.size()), dctx(x.size()),
      ds0(rows), dw(n);
  std::copy(s0.begin(), s0.end(), s.begin());
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t r = 0; r < rows; ++r)
      s[(t + 1) * rows + r] =
          s[t * rows + r] * w[r % n] + double(x[t * rows + r]) * ctx[t * rows + r];
  for (int64_t t = steps - 1; t >= 0; --t)
    for (int64_t r = 0; r < rows; ++r) {
      const size_t i = t * rows + r;
      g[i] = dy[i] + (t == steps - 1 ? ds[r] : w[r % n] * g[i + rows]);
      dx[i] = g[i] * ctx[i];
      dctx[i] = g[i] * x[i];
      dw[r % n] += g[i] * s[t * rows + r];
      if (t == 0)
        ds0[r] = w[r % n] * g[i];
    }

  for (bool jit : {true, false}) {
    SCOPED_TRACE(jit ? "jit" : "interpreter");
    rnnc::LayerSpec spec;
    spec.cell = cell;
    spec.jit = jit;
    rnnc::Layer layer = rnnc::Layer::fromWeights(spec, {{"w", {{n}, w}}});
    EXPECT_EQ(layer.stateNames(), std::vector<std::string>{"s"});
    std::vector<float> y(x.size()), sn(rows);
    rnnc::SequenceBuffers buffers;
    buffers.input = x.data();
    buffers.sideInputs["ctx"] = ctx.data();
    buffers.initialStates["s"] = s0.data();
    buffers.output = y.data();
    buffers.finalStates["s"] = sn.data();
    layer.forward(buffers, steps, batch);
    EXPECT_LE(maxAbsDiff(y, std::vector<double>(s.begin() + rows, s.end())), 1e-5);
    std::fill(y.begin(), y.end(), 0.0f);
    rnnc::TrainingRecord record = layer.forwardTraining(buffers, steps, batch);
    EXPECT_LE(maxAbsDiff(y, std::vector<double>(s.begin() + rows, s.end())), 1e-5);
    EXPECT_LE(maxAbsDiff(sn, std::vector<double>(s.end() - rows, s.end())), 1e-5);
    auto grads = layer.backward(record, dy.data(), {{"s", ds.data()}});
    EXPECT_LE(maxAbsDiff(grads.at("input").values, dx), 1e-5);
    EXPECT_LE(maxAbsDiff(grads.at("ctx").values, dctx), 1e-5);
    EXPECT_LE(maxAbsDiff(grads.at("s").values, ds0), 1e-5);
    EXPECT_LE(maxAbsDiff(grads.at("w").values, dw), 1e-5);

    // A state the cell does not have is an error that lists its states, wherever it is named.
    rnnc::SequenceBuffers wrong = buffers;
    wrong.initialStates["h"] = s0.data();
    rnnc::test::expectUserError([&] { layer.forward(wrong, steps, batch); },
                                {"an initial h is given but cell 'scale' has no state 'h' "
                                 "(its states: s)"});
    wrong = buffers;
    wrong.finalStates["c"] = sn.data();
    rnnc::test::expectUserError([&] { layer.forward(wrong, steps, batch); },
                                {"a buffer for the final c", "no state 'c'"});
    rnnc::test::expectUserError(
        [&] {
          layer.backward(record, dy.data(), {{"h", ds.data()}});
        },
        {"a gradient of the final h", "no state 'h'"});
  }

  // One step of it through CellStep: s1 = s0 * w + x_0 * ctx_0, rows [B, n].
  rnnc::CellStep step = rnnc::CellStep::fromWeights(cell, {{"w", {{n}, w}}});
  EXPECT_EQ(step.stateNames(), std::vector<std::string>{"s"});
  std::vector<float> s1(rows);
  rnnc::SequenceBuffers one;
  one.input = x.data();
  one.sideInputs["ctx"] = ctx.data();
  one.initialStates["s"] = s0.data();
  one.finalStates["s"] = s1.data();
  step.step(one, batch);
  EXPECT_LE(maxAbsDiff(s1, std::vector<double>(s.begin() + rows, s.begin() + 2 * rows)), 1e-6);
}

} // namespace

namespace {

// The h/c forms keep their contract for cells without c: a cn buffer is left as it is (a c0 is
// an error, as it always was).
TEST(Api, AFinalCBufferForACellWithoutCIsLeftUnwritten) {
  const int64_t input = 3, hidden = 4, batch = 2, steps = 3;
  std::map<std::string, rnnc::WeightTensor> weights{
      {"weight_ih_l0", {{3 * hidden, input}, std::vector<float>(3 * hidden * input, 0.1f)}},
      {"weight_hh_l0", {{3 * hidden, hidden}, std::vector<float>(3 * hidden * hidden, -0.1f)}}};
  rnnc::Layer gru = rnnc::Layer::fromWeights(spec("gru"), weights);
  std::vector<float> x(steps * batch * input, 0.5f), y(steps * batch * hidden),
      hn(batch * hidden, -7.0f), cn(batch * hidden, -7.0f);
  gru.forward(x.data(), steps, batch, nullptr, nullptr, nullptr, y.data(), hn.data(), cn.data());
  EXPECT_NE(hn[0], -7.0f);
  EXPECT_EQ(cn, std::vector<float>(batch * hidden, -7.0f));
  rnnc::test::expectUserError(
      [&] {
        gru.forward(x.data(), steps, batch, nullptr, cn.data(), nullptr, y.data(), nullptr,
                    nullptr);
      },
      {"an initial c is given but cell 'gru' has no state 'c' (its states: h)"});
}

} // namespace

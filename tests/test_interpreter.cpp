// The reference interpreter against values computed independently: closed forms, plain C++
// loops, and PyTorch (the fixtures in tests/fixtures).
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "ir/Error.h"
#include "runtime/data/Npy.h"
#include "runtime/data/SafeTensors.h"
#include "tests/RunSequence.h"

#include "tests/TestSupport.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

using namespace rnnc;

namespace {

std::unique_ptr<ir::Cell> cellFrom(const std::string& text) {
  return frontend::parseCell(text, "<test>");
}

Tensor tensor(TensorShape shape, std::vector<float> values) {
  return Tensor(std::move(shape), std::move(values));
}

TEST(Interpreter, RnnTanhMatchesTheClosedForm) {
  auto cell = cellFrom(R"(cell rnn(input_size, hidden_size) {
    input x[input_size]
    state h[hidden_size]
    param weight_ih[hidden_size, input_size], weight_hh[hidden_size, hidden_size]
    param bias_ih[hidden_size], bias_hh[hidden_size]
    h2 = tanh(x @ weight_ih^T + bias_ih + h @ weight_hh^T + bias_hh)
    return h = h2; output h2
  })");
  TensorMap weights = {{"weight_ih", tensor({1, 1}, {0.5f})},
                       {"weight_hh", tensor({1, 1}, {-0.25f})},
                       {"bias_ih", tensor({1}, {0.1f})},
                       {"bias_hh", tensor({1}, {0.2f})}};
  SequenceRequest request;
  request.engine = Engine::Interpreter;
  request.weights = &weights;
  request.inputs["x"] = tensor({2, 1, 1}, {1.0f, 2.0f});
  request.initialStates["h"] = tensor({1, 1, 1}, {0.3f});
  SequenceResult result = runSequence(*cell, request);

  double h1 = std::tanh(0.5 * 1 + 0.1 - 0.25 * 0.3 + 0.2);
  double h2 = std::tanh(0.5 * 2 + 0.1 - 0.25 * h1 + 0.2);
  ASSERT_EQ(result.output.shape(), (TensorShape{2, 1, 1}));
  EXPECT_NEAR(result.output.data()[0], h1, 1e-6);
  EXPECT_NEAR(result.output.data()[1], h2, 1e-6);
  EXPECT_NEAR(result.finalStates.at("h").data()[0], h2, 1e-6);
  EXPECT_EQ(result.boundCell->sizes, (ir::SizeMap{{"hidden_size", 1}, {"input_size", 1}}));
}

// One step of a cell that uses every op, against the same arithmetic written as plain loops.
TEST(Interpreter, EveryOpMatchesPlainLoops) {
  auto cell = cellFrom(R"(cell everything(n) {
    input x[n]
    state s[n]
    param w[n, n], v[n], lnw[n], lnb[n]
    a = x @ w
    b = max(a, s) - min(a, 0.5) / 2
    c = clamp(b, -0.3, 0.4) * relu(-a) + exp(-a) + log(1 + a * a) + sqrt(a * a + v * v)
    parts = cat(c, x)
    lo, hi = chunk(parts, 2)
    d = layernorm(lo + hi, lnw, lnb, eps=0.001) + sigmoid(x) + tanh(s)
    return s = d; output d
  })");
  const int n = 3, batch = 2;
  std::vector<float> x = {0.3f, -1.2f, 0.7f, 2.0f, -0.1f, 0.05f};
  std::vector<float> s = {-0.4f, 0.9f, 0.2f, 0.0f, 1.5f, -2.0f};
  std::vector<float> w = {0.2f, -0.5f, 0.1f, 0.7f, 0.3f, -0.2f, -0.6f, 0.4f, 0.9f};
  std::vector<float> v = {0.1f, -0.2f, 0.3f}, lnw = {1.5f, 0.5f, -1.0f}, lnb = {0.1f, 0.0f, -0.1f};
  TensorMap weights = {{"w", tensor({n, n}, w)},
                       {"v", tensor({n}, v)},
                       {"lnw", tensor({n}, lnw)},
                       {"lnb", tensor({n}, lnb)}};
  SequenceRequest request;
  request.engine = Engine::Interpreter;
  request.weights = &weights;
  request.inputs["x"] = tensor({1, batch, n}, x);
  request.initialStates["s"] = tensor({1, batch, n}, s);
  SequenceResult result = runSequence(*cell, request);

  for (int r = 0; r < batch; ++r) {
    double d[n], sum = 0;
    for (int j = 0; j < n; ++j) {
      double a = 0;
      for (int k = 0; k < n; ++k)
        a += x[r * n + k] * w[k * n + j];
      double b = std::max(a, double(s[r * n + j])) - std::min(a, 0.5) / 2;
      double c = std::clamp(b, -0.3, 0.4) * std::max(-a, 0.0) + std::exp(-a) + std::log(1 + a * a) +
                 std::sqrt(a * a + v[j] * v[j]);
      d[j] = c + x[r * n + j]; // chunk(cat(c, x), 2) splits exactly into c and x
      sum += d[j];
    }
    double mean = sum / n, var = 0;
    for (double value : d)
      var += (value - mean) * (value - mean) / n;
    for (int j = 0; j < n; ++j) {
      double expected = (d[j] - mean) / std::sqrt(var + 0.001) * lnw[j] + lnb[j] +
                        1 / (1 + std::exp(-x[r * n + j])) + std::tanh(s[r * n + j]);
      EXPECT_NEAR(result.output.data()[r * n + j], expected, 2e-6) << "row " << r << " col " << j;
    }
  }
}

Tensor runElementwise(const std::string& body, std::vector<float> x) {
  auto cell = cellFrom("cell f(n) {\n input x[n]\n y = " + body + "\n return; output y\n}");
  TensorMap none;
  SequenceRequest request;
  request.engine = Engine::Interpreter;
  request.weights = &none;
  int64_t n = static_cast<int64_t>(x.size());
  request.inputs["x"] = tensor({1, 1, n}, std::move(x));
  return runSequence(*cell, request).output;
}

TEST(Interpreter, SpecialValuesFollowPyTorch) {
  const float inf = INFINITY, nan = NAN;
  Tensor sig = runElementwise("sigmoid(x)", {-inf, inf, 0.0f, -100.0f, nan});
  EXPECT_EQ(sig.data()[0], 0.0f);
  EXPECT_EQ(sig.data()[1], 1.0f);
  EXPECT_EQ(sig.data()[2], 0.5f);
  EXPECT_GE(sig.data()[3], 0.0f);
  EXPECT_TRUE(std::isnan(sig.data()[4]));
  Tensor th = runElementwise("tanh(x)", {-inf, inf, nan});
  EXPECT_EQ(th.data()[0], -1.0f);
  EXPECT_EQ(th.data()[1], 1.0f);
  EXPECT_TRUE(std::isnan(th.data()[2]));
  for (const char* f : {"relu(x)", "min(x, 0)", "max(x, 0)", "clamp(x, -1, 1)"})
    EXPECT_TRUE(std::isnan(runElementwise(f, {nan}).data()[0])) << f << " must propagate NaN";
}

// exp, log and sqrt at the edges of float's range, against double-precision libm rounded to
// float: the interpreter is the reference for the JIT (and the fuzzer), which is right there.
// Eigen's versions were not: exp(88.5) overflowed, log(1e-40) read the subnormal as zero
// (-87.3), sqrt(inf) was NaN, and a fuzzed cell got NaN states from the reference alone.
TEST(Interpreter, ExpLogAndSqrtAreRightAtTheEdgesOfFloat) {
  const float inf = INFINITY;
  // 32 values: whole vectors of any width, where Eigen takes its vector code (a tail is scalar).
  std::vector<float> x = {88.5f, 88.7f, -100.0f, 1e-40f, 1e-45f, inf, 3.4e38f, 0.0f};
  for (int i = 0; i < 3; ++i)
    x.insert(x.end(), x.begin(), x.begin() + 8);
  for (const auto& [body, f] : std::vector<std::pair<std::string, double (*)(double)>>{
           {"exp(x)", std::exp}, {"log(x)", std::log}, {"sqrt(x)", std::sqrt}}) {
    Tensor y = runElementwise(body, x);
    for (size_t i = 0; i < x.size(); ++i) {
      const auto expected = static_cast<float>(f(x[i]));
      if (std::isnan(expected)) // log and sqrt of -100
        EXPECT_TRUE(std::isnan(y.data()[i])) << body << " at " << x[i];
      else if (std::isinf(expected) || expected == 0)
        EXPECT_EQ(y.data()[i], expected) << body << " at " << x[i];
      else // libm's float functions are within an ulp or so; subnormals as their spacing allows
        EXPECT_NEAR(y.data()[i], expected, std::max(2e-7 * std::abs(expected), 1e-44))
            << body << " at " << x[i];
    }
  }
}

TEST(Interpreter, DropoutIsIdentityInInferenceAndSeededInTraining) {
  auto cell = cellFrom("cell d(n) {\n input x[n]\n y = dropout(x, 0.25)\n return; output y\n}");
  TensorMap none;
  SequenceRequest request;
  request.engine = Engine::Interpreter;
  request.weights = &none;
  request.inputs["x"] = Tensor({4, 8, 256}, 1.0f);
  Tensor inference = runSequence(*cell, request).output;
  EXPECT_EQ(inference.values(), request.inputs["x"].values());

  request.options.training = true;
  request.options.seed = 7;
  Tensor a = runSequence(*cell, request).output;
  Tensor b = runSequence(*cell, request).output;
  EXPECT_EQ(a.values(), b.values()) << "same seed, same mask";
  int64_t zeros = 0;
  for (float value : a.values()) {
    EXPECT_TRUE(value == 0.0f || std::abs(value - 1.0f / 0.75f) < 1e-6f) << value;
    zeros += value == 0.0f;
  }
  EXPECT_NEAR(static_cast<double>(zeros) / a.numel(), 0.25, 0.02);
  request.options.seed = 8;
  EXPECT_NE(runSequence(*cell, request).output.values(), a.values());
}

// ---- Sizes and weights: errors that name the tensor and both shapes ----------------------

const char* kTwoSizeCell = R"(cell two(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param weight_ih[2*hidden_size, input_size], weight_hh[2*hidden_size, hidden_size]
  a, b = chunk(x @ weight_ih^T + h @ weight_hh^T, 2)
  return h = a * b; output a
})";

template <class F> std::string errorOf(F&& body) {
  try {
    body();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Weights, WrongShapeNamesTheTensorAndBothShapes) {
  auto cell = cellFrom(kTwoSizeCell);
  TensorMap weights = {{"weight_ih_l0", Tensor({6, 4})}, {"weight_hh_l0", Tensor({6, 2})}};
  SequenceRequest request;
  request.engine = Engine::Interpreter;
  request.weights = &weights;
  request.weightsSource = "w.safetensors";
  request.inputs["x"] = Tensor({2, 1, 4});
  EXPECT_EQ(errorOf([&] { runSequence(*cell, request); }),
            "w.safetensors: tensor 'weight_hh_l0' has shape [6, 2], expected "
            "[2*hidden_size, hidden_size] = [6, 3]; hidden_size = 3 from w.safetensors: tensor "
            "'weight_ih_l0'");
}

TEST(Weights, InputFeatureMismatchNamesTheInput) {
  auto cell = cellFrom(kTwoSizeCell);
  TensorMap weights = {{"weight_ih", Tensor({6, 4})}, {"weight_hh", Tensor({6, 3})}};
  SequenceRequest request;
  request.engine = Engine::Interpreter;
  request.weights = &weights;
  request.inputs["x"] = Tensor({2, 1, 5});
  EXPECT_EQ(errorOf([&] { runSequence(*cell, request); }),
            "input has shape [2, 1, 5], expected [T, B, input_size] = [2, 1, 4]; "
            "input_size = 4 from weights: tensor 'weight_ih'");
}

TEST(Weights, MissingTensorListsWhatTheFileHas) {
  auto cell = cellFrom(kTwoSizeCell);
  TensorMap weights = {{"weight_ih_l0", Tensor({6, 4})}};
  SequenceRequest request;
  request.engine = Engine::Interpreter;
  request.weights = &weights;
  request.weightsSource = "w.safetensors";
  request.inputs["x"] = Tensor({2, 1, 4});
  EXPECT_EQ(errorOf([&] { runSequence(*cell, request); }),
            "w.safetensors: no tensor for parameter 'weight_hh' of cell 'two' (looked for "
            "'weight_hh' and 'weight_hh_l0'); the file has: weight_ih_l0");
}

TEST(Weights, OddSizedWeightCannotSolveAMultiple) {
  auto cell = cellFrom(kTwoSizeCell);
  TensorMap weights = {{"weight_ih", Tensor({5, 4})}, {"weight_hh", Tensor({6, 3})}};
  SequenceRequest request;
  request.engine = Engine::Interpreter;
  request.weights = &weights;
  request.inputs["x"] = Tensor({2, 1, 4});
  EXPECT_NE(errorOf([&] {
              runSequence(*cell, request);
            }).find("tensor 'weight_ih' has shape [5, 4], expected [2*hidden_size, input_size]"),
            std::string::npos);
}

TEST(Weights, SizeOnlyInAStateNeedsExplicitSize) {
  auto cell = cellFrom(R"(cell k(n, m) {
    input x[n]
    state s[m]
    return s = s; output x
  })");
  TensorMap none;
  SequenceRequest request;
  request.engine = Engine::Interpreter;
  request.weights = &none;
  request.inputs["x"] = Tensor({1, 1, 2});
  EXPECT_EQ(errorOf([&] { runSequence(*cell, request); }),
            "size 'm' of cell 'k' appears in no tensor given; pass it with --size m=VALUE");
  request.sizes["m"] = 5;
  EXPECT_EQ(runSequence(*cell, request).finalStates.at("s").shape(), (TensorShape{1, 1, 5}));
}

TEST(Weights, TwoUnknownSizesInOneDimensionNeedExplicitSizes) {
  auto cell = cellFrom(R"(cell k(a, b) {
    input x[a + b]
    param w[a + b]
    return; output x * w
  })");
  TensorMap weights = {{"w", Tensor({5}, 2.0f)}};
  SequenceRequest request;
  request.engine = Engine::Interpreter;
  request.weights = &weights;
  request.inputs["x"] = Tensor({1, 1, 5}, 1.0f);
  EXPECT_EQ(errorOf([&] { runSequence(*cell, request); }),
            "cannot infer the sizes a, b of cell 'k' from the shapes given; pass them with "
            "--size NAME=VALUE");
  request.sizes["a"] = 2;
  SequenceResult result = runSequence(*cell, request);
  EXPECT_EQ(result.boundCell->sizes, (ir::SizeMap{{"a", 2}, {"b", 3}}));
  EXPECT_EQ(result.output.values(), TensorData(5, 2.0f));
}

// ---- PyTorch fixtures through the library --------------------------------------------------

std::vector<std::string> fixtureCases() {
  std::vector<std::string> cases;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(RNNC_SOURCE_DIR) + "/tests/fixtures"))
    if (std::filesystem::exists(entry.path() / "meta.json")) // not the layers/ folder
      cases.push_back(entry.path().filename().string());
  std::sort(cases.begin(), cases.end());
  return cases;
}

using test::maxAbsDiff;

class PyTorchFixture : public testing::TestWithParam<std::string> {};

TEST_P(PyTorchFixture, InterpreterMatchesPyTorchWithin1e5) {
  std::string dir = std::string(RNNC_SOURCE_DIR) + "/tests/fixtures/" + GetParam() + "/";
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir + "meta.json"));
  auto cell = frontend::loadCell(meta["cell"].get<std::string>());
  TensorMap weights = readSafeTensors(dir + "weights.safetensors");
  SequenceRequest request;
  request.engine = Engine::Interpreter;
  request.weights = &weights;
  request.inputs["x"] = readNpyFloat32(dir + "input.npy");
  request.initialStates["h"] = readNpyFloat32(dir + "h0.npy");
  bool hasC = meta["has_c"].get<bool>();
  if (hasC)
    request.initialStates["c"] = readNpyFloat32(dir + "c0.npy");
  SequenceResult result = runSequence(*cell, request);
  EXPECT_LE(maxAbsDiff(result.output, readNpyFloat32(dir + "output.npy")), 1e-5f);
  EXPECT_LE(maxAbsDiff(result.finalStates.at("h"), readNpyFloat32(dir + "hn.npy")), 1e-5f);
  if (hasC) {
    EXPECT_LE(maxAbsDiff(result.finalStates.at("c"), readNpyFloat32(dir + "cn.npy")), 1e-5f);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PyTorchFixture, testing::ValuesIn(fixtureCases()),
                         [](const auto& info) { return info.param; });

} // namespace

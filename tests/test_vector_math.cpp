// The generated code's own exp, log, sigmoid and tanh (codegen/VectorMath) against double
// precision over dense sweeps and every special value, at the target's vector width and in the
// one-lane loop tail. The documented bounds: sigmoid and tanh within 5e-7 absolute.
#include "frontend/CellParser.h"
#include "runtime/exec/CompiledCell.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>

using namespace rnnc;

namespace {

// Runs `body` (an expression of x) on every value at once: one step, one row.
std::vector<float> jitElementwise(const std::string& body, const std::vector<float>& x) {
  auto cell = frontend::parseCell(
      "cell f(n) {\n input x[n]\n y = " + body + "\n return; output y\n}", "<math>");
  cell->bindSizes({{"n", static_cast<int64_t>(x.size())}});
  CompileOptions options;
  options.cache.disk = false;
  auto compiled = CompiledCell::compile(*cell, options);
  std::vector<Tensor> states;
  Tensor input({1, 1, static_cast<int64_t>(x.size())}, x);
  const TensorData y = compiled->run({}, {input}, states).values();
  return {y.begin(), y.end()};
}

// Dense in [-span, span], plus large magnitudes and the values where the formulas switch.
std::vector<float> sweep(float span) {
  std::vector<float> x;
  for (int i = -200000; i <= 200000; ++i)
    x.push_back(span * static_cast<float>(i) / 200000.0f);
  for (float big : {30.0f, 50.0f, 87.0f, 88.5f, 89.0f, 100.0f, 1e4f, 1e30f, 3e38f})
    for (float sign : {1.0f, -1.0f})
      x.push_back(sign * big);
  for (float small : {1e-3f, 1e-10f, 1e-30f, 1e-38f, 1e-45f})
    for (float sign : {1.0f, -1.0f})
      x.push_back(sign * small);
  x.push_back(0.0f);
  x.push_back(-0.0f);
  x.push_back(1.0f);
  x.push_back(-1.0f); // 400033 values: the single-vector loop and the one-lane tail run too
  return x;
}

template <class Reference>
double maxAbsError(const std::vector<float>& x, const std::vector<float>& y, Reference f) {
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double error = std::abs(static_cast<double>(y[i]) - f(static_cast<double>(x[i])));
    worst = std::isnan(error) || std::isnan(worst) ? error + worst : std::max(worst, error);
  }
  return worst;
}

std::string scientific(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", v);
  return text;
}

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(VectorMath, SigmoidWithin5e7Absolute) {
  std::vector<float> x = sweep(30.0f);
  std::vector<float> y = jitElementwise("sigmoid(x)", x);
  double error = maxAbsError(x, y, [](double v) { return 1 / (1 + std::exp(-v)); });
  EXPECT_LE(error, 5e-7);
  RecordProperty("max_abs_error", scientific(error));
}

TEST(VectorMath, TanhWithin5e7Absolute) {
  std::vector<float> x = sweep(12.0f);
  std::vector<float> y = jitElementwise("tanh(x)", x);
  double error = maxAbsError(x, y, [](double v) { return std::tanh(v); });
  EXPECT_LE(error, 5e-7);
  RecordProperty("max_abs_error", scientific(error));
}

TEST(VectorMath, ExpAndLogWithinAFewUlpRelative) {
  std::vector<float> x = sweep(87.0f);
  std::vector<float> y = jitElementwise("exp(x)", x);
  for (size_t i = 0; i < x.size(); ++i) {
    double expected = std::exp(static_cast<double>(x[i]));
    if (expected > 1.2e-38 && expected < 3.4e38) {
      ASSERT_NEAR(y[i] / expected, 1.0, 3e-7) << "exp(" << x[i] << ")";
    }
  }
  std::vector<float> positive;
  for (float v : x)
    positive.push_back(std::abs(v) + 1e-30f);
  positive.push_back(1e-40f); // a denormal
  std::vector<float> logs = jitElementwise("log(x)", positive);
  for (size_t i = 0; i < positive.size(); ++i) {
    double expected = std::log(static_cast<double>(positive[i]));
    ASSERT_NEAR(logs[i], expected, 3e-7 * std::max(1.0, std::abs(expected)))
        << "log(" << positive[i] << ")";
  }
}

// Each special value with its exact expected result (NaN: any NaN). The values repeat over 91
// elements, so that each lands in the interleaved vector loop (32 floats), in the single-vector
// loop (AVX-512: 64-79, AVX2: 64-87), in the one-lane tail, and in different lanes.
void expectExactly(const std::string& body, const std::vector<std::pair<float, float>>& cases) {
  std::vector<float> x;
  for (size_t i = 0; i < 91; ++i)
    x.push_back(cases[i % cases.size()].first);
  std::vector<float> y = jitElementwise(body, x);
  for (size_t i = 0; i < x.size(); ++i) {
    float expected = cases[i % cases.size()].second;
    if (std::isnan(expected))
      EXPECT_TRUE(std::isnan(y[i])) << body << " at x = " << x[i] << ", element " << i;
    else
      EXPECT_EQ(y[i], expected) << body << " at x = " << x[i] << ", element " << i;
  }
}

TEST(VectorMath, SpecialValuesBehaveAsInPyTorch) {
  expectExactly("sigmoid(x)", {{-kInf, 0.0f},
                               {kInf, 1.0f},
                               {kNaN, kNaN},
                               {0.0f, 0.5f},
                               {200.0f, 1.0f},
                               {-200.0f, 0.0f},
                               {-89.0f, 0.0f},
                               {30.0f, 1.0f}});
  expectExactly("tanh(x)", {{-kInf, -1.0f},
                            {kInf, 1.0f},
                            {kNaN, kNaN},
                            {0.0f, 0.0f},
                            {200.0f, 1.0f},
                            {-200.0f, -1.0f},
                            {12.0f, 1.0f}});
  expectExactly(
      "exp(x)",
      {{-kInf, 0.0f}, {kInf, kInf}, {kNaN, kNaN}, {0.0f, 1.0f}, {200.0f, kInf}, {-200.0f, 0.0f}});
  std::vector<float> lg = jitElementwise("log(x)", {0.0f, kInf, -1.0f, kNaN, 1.0f});
  EXPECT_EQ(lg[0], -kInf);
  EXPECT_EQ(lg[1], kInf);
  EXPECT_TRUE(std::isnan(lg[2]));
  EXPECT_TRUE(std::isnan(lg[3]));
  EXPECT_EQ(lg[4], 0.0f);
  for (const char* f : {"relu(x)", "min(x, 0)", "max(x, 0)", "clamp(x, -1, 1)", "sqrt(x)"})
    EXPECT_TRUE(std::isnan(jitElementwise(f, {kNaN})[0])) << f << " must propagate NaN";
}

} // namespace

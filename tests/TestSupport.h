// Helpers shared by the test files: a scratch directory per test, random tensors and weights,
// and cells more than one test file uses.
#pragma once

#include "ir/Cell.h"
#include "ir/Error.h"
#include "runtime/data/SafeTensors.h"
#include "tests/RandomTensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <unistd.h>

namespace rnnc::test {

// The layers PyTorch computed (tests/fixtures/layers/), with a trailing slash.
inline const std::string kLayerFixtures = std::string(RNNC_SOURCE_DIR) + "/tests/fixtures/layers/";

// Runs `action` and checks it throws a UserError whose message contains every fragment.
inline void expectUserError(const std::function<void()>& action,
                            std::initializer_list<std::string> fragments) {
  try {
    action();
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    for (const std::string& fragment : fragments)
      EXPECT_THAT(std::string(e.what()), testing::HasSubstr(fragment));
  }
}

// A fixture with an empty directory of its own, per test and process, so that parallel runs
// (ctest -j, two build trees) never share files.
class ScratchDirTest : public testing::Test {
protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(testing::TempDir()) /
           (std::string("rnnc_") + info->test_suite_name() + "_" + info->name() + "_" +
            std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes `bytes` to the file `name` in the directory; returns its path.
  std::string writeBytes(const std::string& name, const std::string& bytes) const {
    std::string p = path(name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }

  static std::string readBytes(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // Runs `action` and checks it throws a UserError that starts with the path `p` and contains
  // every fragment.
  static void expectError(const std::string& p, const std::function<void()>& action,
                          std::initializer_list<std::string> fragments) {
    try {
      action();
      ADD_FAILURE() << "expected a UserError for " << p;
    } catch (const UserError& e) {
      std::string message = e.what();
      EXPECT_THAT(message, testing::StartsWith(p + ": "));
      for (const std::string& fragment : fragments)
        EXPECT_THAT(message, testing::HasSubstr(fragment));
    }
  }

  std::filesystem::path dir_;
};

// The largest |a[i] - b[i]|, after checking the shapes agree.
// max(worst, difference) that keeps a NaN once one is seen: std::max(worst, NaN) is worst, so a
// NaN result would pass `EXPECT_LT(worst, tolerance)`.
template <class F> F worseOf(F worst, F difference) {
  return std::isnan(worst) || std::isnan(difference) ? std::numeric_limits<F>::quiet_NaN()
                                                     : std::max(worst, difference);
}

// The largest |a - b|; NaN where either holds a NaN the other does not (std::max would drop
// it, and a NaN result then passes every `EXPECT_LT(maxAbsDiff(...), tolerance)`).
inline float maxAbsDiff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  float worst = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
    const float x = a.data()[i], y = b.data()[i];
    if (std::isnan(x) != std::isnan(y))
      return std::numeric_limits<float>::quiet_NaN();
    if (!std::isnan(x))
      worst = std::max(worst, std::abs(x - y));
  }
  return worst;
}

// An LSTM written with a separate linear per gate, in varied styles: the passes must turn it
// into one product per operand.
inline const char* kFourGateLstm = R"(cell lstm4(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size], c[hidden_size]
  param w_ii[hidden_size, input_size], w_if[hidden_size, input_size]
  param w_ig[hidden_size, input_size], w_io[hidden_size, input_size]
  param w_hi[hidden_size, hidden_size], w_hf[hidden_size, hidden_size]
  param w_hg[hidden_size, hidden_size], w_ho[hidden_size, hidden_size]
  param b_i[hidden_size], b_f[hidden_size], b_g[hidden_size], b_o[hidden_size]
  i = sigmoid(linear(x, w_ii) + linear(h, w_hi) + b_i)
  f = sigmoid(linear(x, w_if, b_f) + linear(h, w_hf))
  g = tanh(b_g + x @ w_ig^T + h @ w_hg^T)
  o = sigmoid(linear(h, w_ho) + (linear(x, w_io) + b_o))
  c2 = f * c + i * g
  h2 = o * tanh(c2)
  return h = h2, c = c2; output h2
})";

} // namespace rnnc::test

// Mixed-precision training (LayerOptions::compile.weights bf16 or fp16 in a GradientProgram):
// the training forward's and the backward step's products read the weights rounded as the
// packing rounds them, the input gradients' products the same rounded weights, and everything
// else (states, kept values, gradients, the weight gradients' products) stays fp32. fp16
// products multiply the rounded weights in fp32, so their gradients are the fp32 gradients of the
// model whose weights are the rounded ones: the oracle is the interpreter's fp32 training on
// weights rounded by Eigen. bf16 products round their other operand too: the interpreter, which
// rounds its products as the generated code does, is their oracle.
#include "codegen/HostTarget.h"
#include "codegen/WeightType.h"
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "runtime/layers/Gradients.h"
#include "tests/RandomTensors.h"
#include "tests/RunnableCpus.h"
#include "tests/TestSupport.h"

#include <Eigen/Core>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

using namespace rnnc;
using codegen::WeightType;

namespace {

// The oracle's rounding: Eigen's, not the runtime's.
float roundedAs(float v, WeightType type) {
  return type == WeightType::BF16 ? static_cast<float>(Eigen::bfloat16(v))
                                  : static_cast<float>(Eigen::half(v));
}

// Every matrix (what linear and matmul read) rounded; vectors (biases, norms) as given.
TensorMap withRoundedMatrices(TensorMap weights, WeightType type) {
  for (auto& [name, t] : weights)
    if (t.rank() == 2)
      for (float& v : t.values())
        v = roundedAs(v, type);
  return weights;
}

// The largest |difference| of each gradient over that gradient's own largest |value|.
double worstRelativeError(const TensorMap& actual, const TensorMap& expected) {
  double worst = 0;
  for (const auto& [name, want] : expected) {
    const Tensor& got = actual.at(name);
    double scale = 1e-6;
    for (float v : want.values())
      scale = std::max<double>(scale, std::abs(v));
    worst = std::max<double>(worst, test::maxAbsDiff(got, want) / scale);
  }
  return worst;
}

// A custom cell with a layer norm, `h @ u` (matmul), a weight made of parameters and a
// parameter vector read elementwise: every kind of product a cell can have. (The weight made
// of parameters is one whose rounding the oracle can take from its parameter's: halving is
// exact.)
const char* kCustomCell = R"(cell custom(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size], c[hidden_size]
  param w[2*hidden_size, input_size], u[hidden_size, 2*hidden_size], v[hidden_size]
  param s[2*hidden_size, hidden_size], ln.weight[hidden_size]
  a, g = chunk(linear(x, w) + h @ u + linear(c, s * 0.5), 2)
  n = layernorm(a, ln.weight, eps=0.001)
  c2 = sigmoid(g) * c + (1 - sigmoid(g)) * tanh(n + v * c)
  h2 = tanh(c2) * sigmoid(n)
  return h = h2, c = c2; output h2
})";

struct Case {
  std::unique_ptr<ir::Cell> cell;
  TensorMap weights;
  GradientRequest request;
  int64_t directions = 1;
};

// Two layers in both directions, sequences of several lengths, given initial states and
// final-state gradients.
Case makeCase(std::unique_ptr<ir::Cell> cell, unsigned seed) {
  Case c;
  c.cell = std::move(cell);
  c.directions = 2;
  const int64_t steps = 6, batch = 5, input = 7, hidden = 12;
  std::mt19937 rng(seed);
  ir::SizeMap sizes = {{"input_size", input}, {"hidden_size", hidden}};
  if (std::find(c.cell->sizeNames.begin(), c.cell->sizeNames.end(), "proj_size") !=
      c.cell->sizeNames.end())
    sizes["proj_size"] = hidden - 3;
  int64_t outputWidth = 0;
  for (int layer = 0; layer < 2; ++layer)
    for (const char* direction : {"", "_reverse"}) {
      ir::SizeMap layerSizes = sizes;
      if (layer == 1)
        layerSizes["input_size"] = 2 * outputWidth;
      for (auto& [name, t] : test::randomWeights(*c.cell, layerSizes, rng))
        c.weights[name + "_l" + std::to_string(layer) + direction] = std::move(t);
      if (layer == 0) {
        std::unique_ptr<ir::Cell> bound = c.cell->clone();
        bound->bindSizes(sizes);
        outputWidth = ir::columnsOf(bound->output);
      }
    }
  c.request.weights = &c.weights;
  c.request.input = test::randomTensor({steps, batch, input}, rng, 1.0f);
  c.request.lengths = Int64Array{{batch}, {6, 2, 5, 1, 6}};
  std::unique_ptr<ir::Cell> bound = c.cell->clone();
  bound->bindSizes(sizes);
  for (const auto& state : bound->states) {
    const int64_t width = ir::columnsOf(state.get());
    c.request.initialStates[state->name] = test::randomTensor({4, batch, width}, rng, 0.5f);
    c.request.gradFinalStates[state->name] = test::randomTensor({4, batch, width}, rng, 1.0f);
  }
  c.request.gradOutput = test::randomTensor({steps, batch, 2 * outputWidth}, rng, 1.0f);
  return c;
}

std::vector<Case> allCases() {
  std::vector<Case> cases;
  unsigned seed = 11;
  for (const std::string& name : frontend::builtinCellNames())
    cases.push_back(makeCase(frontend::loadCell(name), seed++));
  cases.push_back(makeCase(frontend::parseCell(kCustomCell, "custom.cell"), seed++));
  return cases;
}

TensorMap gradients(Case& c, Engine engine, WeightType type, const std::string& cpu,
                    const TensorMap& weights) {
  GradientRequest request = c.request;
  request.weights = &weights;
  LayerOptions options;
  options.engine = engine;
  options.compile.weights = type;
  options.compile.targetCpu = cpu;
  options.compile.cache.disk = false;
  return runGradients(*c.cell, request, options).gradients;
}

// The targets whose code runs here: AVX2's, AVX-512's (widened bf16), the host's own, and
// Zen 4's (vdpbf16ps pairs) where the host has AVX512_BF16.
std::vector<std::string> cpusHere() {
  std::vector<std::string> cpus = test::runnableCpus();
  cpus.push_back("");
  if (codegen::detectHostTarget().has("avx512bf16"))
    cpus.push_back("znver4");
  return cpus;
}

// fp16 products multiply the rounded weights in fp32 on every target: mixed precision's
// gradients are the interpreter's fp32 gradients on the rounded weights (to fp32's rounding of
// the sums), and not those on the weights as given (by the rounding's 2^-12): the backward
// reads the weights the forward rounded, in the step and in the input gradients' products alike.
TEST(MixedPrecisionTraining, Fp16GradientsAreThoseOfTheRoundedWeights) {
  for (Case& c : allCases()) {
    const TensorMap rounded = withRoundedMatrices(c.weights, WeightType::F16);
    const TensorMap oracle = gradients(c, Engine::Interpreter, WeightType::F32, "", rounded);
    const TensorMap asGiven = gradients(c, Engine::Interpreter, WeightType::F32, "", c.weights);
    for (const std::string& cpu : cpusHere()) {
      SCOPED_TRACE(c.cell->name + " on " + (cpu.empty() ? "the host" : cpu));
      const TensorMap mixed = gradients(c, Engine::Jit, WeightType::F16, cpu, c.weights);
      EXPECT_EQ(mixed.size(), oracle.size());
      EXPECT_LT(worstRelativeError(mixed, oracle), 1e-4);
      EXPECT_GT(worstRelativeError(mixed, asGiven), 5e-5);
    }
  }
}

// The interpreter computes its products as the generated code does (withProductsAs: bf16's
// operands both rounded, fp16's weights), in its own way (Eigen, op by op): the JIT's
// mixed-precision gradients match it on every target, to fp32's rounding of the sums (and of
// bf16's roundings that it tips).
TEST(MixedPrecisionTraining, JitGradientsMatchTheInterpretersReducedProducts) {
  for (Case& c : allCases())
    for (WeightType type : {WeightType::BF16, WeightType::F16}) {
      const TensorMap oracle = gradients(c, Engine::Interpreter, type, "", c.weights);
      for (const std::string& cpu : cpusHere()) {
        SCOPED_TRACE(c.cell->name + ", " + std::string(codegen::weightTypeName(type)) + " on " +
                     (cpu.empty() ? "the host" : cpu));
        const TensorMap mixed = gradients(c, Engine::Jit, type, cpu, c.weights);
        EXPECT_EQ(mixed.size(), oracle.size());
        // bf16 rounds the products' inputs: where the two sum a value in another order (AMX
        // tiles, vdpbf16ps pairs), its rounding may tip by one bf16 step (2^-8 relative).
        EXPECT_LT(worstRelativeError(mixed, oracle), type == WeightType::F16 ? 1e-4 : 2e-3);
      }
    }
}

// ||a - b|| / ||b|| (Frobenius), the worst over the gradients.
double worstNormError(const TensorMap& actual, const TensorMap& expected) {
  double worst = 0;
  for (const auto& [name, want] : expected) {
    const Tensor& got = actual.at(name);
    double difference = 0, norm = 1e-12;
    for (int64_t i = 0; i < want.numel(); ++i) {
      difference += std::pow(double(got.data()[i]) - want.data()[i], 2);
      norm += std::pow(double(want.data()[i]), 2);
    }
    worst = std::max(worst, std::sqrt(difference / norm));
  }
  return worst;
}

// Against the fp32 gradients of the rounded weights, bf16's rounding of the products' other
// operand (activations, output gradients) stays within 1e-2 of each gradient, as a whole, for the
// cells whose gates are smooth. (A relu RNN's are not: a rounding that tips a pre-activation
// across zero switches that unit's gradient path off or on; at this size 14% of a gradient.)
TEST(MixedPrecisionTraining, Bf16GradientsOfSmoothCellsStayWithin1e2OfTheRoundedWeightsFp32) {
  for (Case& c : allCases()) {
    if (c.cell->name == "rnn_relu")
      continue;
    SCOPED_TRACE(c.cell->name);
    const TensorMap rounded = withRoundedMatrices(c.weights, WeightType::BF16);
    const TensorMap fp32 = gradients(c, Engine::Interpreter, WeightType::F32, "", rounded);
    const TensorMap mixed = gradients(c, Engine::Jit, WeightType::BF16, "", c.weights);
    EXPECT_LT(worstNormError(mixed, fp32), 1e-2);
  }
}

TEST(MixedPrecisionTraining, Int8AndCellsWithoutWeightProductsAreClearErrors) {
  auto cell = frontend::loadCell("gru");
  std::mt19937 rng(3);
  TensorMap weights = test::randomWeights(*cell, {{"input_size", 3}, {"hidden_size", 4}}, rng);
  for (Engine engine : {Engine::Jit, Engine::Interpreter}) {
    LayerOptions options;
    options.engine = engine;
    options.compile.weights = WeightType::I8;
    test::expectUserError(
        [&] { GradientProgram::build(*cell, weights, "weights", options); },
        {"int8 weights are for inference: train in fp32, bf16 or fp16, then run the trained "
         "weights as int8"});
  }
  auto elementwise = frontend::parseCell(R"(cell leaky(input_size) {
  input x[input_size]
  state h[input_size]
  param a[input_size]
  h2 = tanh(x + a * h)
  return h = h2; output h2
})",
                                         "leaky.cell");
  TensorMap leakyWeights = test::randomWeights(*elementwise, {{"input_size", 3}}, rng);
  for (Engine engine : {Engine::Jit, Engine::Interpreter}) {
    LayerOptions options;
    options.engine = engine;
    options.compile.weights = WeightType::BF16;
    options.compile.cache.disk = false;
    test::expectUserError(
        [&] { GradientProgram::build(*elementwise, leakyWeights, "weights", options); },
        {"cell 'leaky' has no linear or matmul with parameter weights: bf16 weights would "
         "change nothing"});
  }
}

} // namespace

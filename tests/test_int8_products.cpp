// int8 weights (--weights-dtype int8, codegen/QuantizedProducts.cpp) against a reference written
// here from the scheme's definition (per-column symmetric weights, per-row 7-bit asymmetric
// inputs, exact integer sums, the same fp32 dequantization): the input projection (its rows
// quantized in chunks, and the sequence in chunks of steps) and the recurrent product (h
// quantized at every step), at sizes no tile, vector or group of 4 divides, at batch 1, on 1 and
// 2 threads, for every target this host runs; then the built-in cells against fp32, special
// values, and the errors.
#include "codegen/Compiler.h"
#include "codegen/HostTarget.h"
#include "codegen/Target.h"
#include "codegen/WeightType.h"
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "ir/Error.h"
#include "passes/PassManager.h"
#include "runtime/data/Npy.h"
#include "runtime/data/SafeTensors.h"
#include "runtime/exec/CompiledCell.h"
#include "runtime/exec/Interpreter.h"
#include "runtime/layers/LayerRunner.h"
#include "tests/LayerOutputs.h"
#include "tests/RandomTensors.h"
#include "tests/RunnableCpus.h"
#include "tests/TestSupport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

using namespace rnnc;
using codegen::WeightType;

namespace {

// AVX2 (vpmaddubsw), AVX-512 where the host runs it, and the host itself where it has VNNI
// (vpdpbusd): "" is the host.
std::vector<std::string> int8Cpus() {
  const codegen::HostTarget host = codegen::detectHostTarget();
  std::vector<std::string> cpus = test::runnableCpus();
  if (host.has("avxvnni") || (host.has("avx512vnni") && host.has("avx512vl")))
    cpus.push_back("");
  return cpus;
}

float roundClamped(float v, float lowest, float highest) {
  return std::clamp(std::nearbyint(v), lowest, highest);
}

// W [N, K] quantized per row (an output column): scale = max|w| / 127, q = round(w / scale).
struct QuantizedWeights {
  int64_t n = 0, k = 0;
  std::vector<int> q;
  std::vector<float> scale, columnSum;
};

QuantizedWeights quantizeWeights(const Tensor& w) {
  QuantizedWeights out{w.dim(0), w.dim(1), {}, {}, {}};
  for (int64_t j = 0; j < out.n; ++j) {
    const float* row = w.data() + j * out.k;
    float largest = 0;
    for (int64_t i = 0; i < out.k; ++i)
      largest = std::max(largest, std::fabs(row[i]));
    float scale = largest / 127;
    if (scale == 0)
      scale = 1;
    int sum = 0;
    for (int64_t i = 0; i < out.k; ++i) {
      out.q.push_back(static_cast<int>(roundClamped(row[i] / scale, -127, 127)));
      sum += out.q.back();
    }
    out.scale.push_back(scale);
    out.columnSum.push_back(static_cast<float>(sum));
  }
  return out;
}

// x [K] times W^T: x quantized to [0, 127] with its zero point, exact integer sums, dequantized.
std::vector<float> quantizedLinear(const float* x, const QuantizedWeights& w) {
  float low = 0, high = 0;
  for (int64_t i = 0; i < w.k; ++i) {
    low = std::min(low, x[i]);
    high = std::max(high, x[i]);
  }
  float scale = (high - low) / 127;
  if (scale == 0)
    scale = 1;
  const float inverse = 1 / scale;
  const float zero = roundClamped(-low / scale, 0, 127);
  std::vector<int> q;
  for (int64_t i = 0; i < w.k; ++i)
    q.push_back(
        static_cast<int>(std::clamp(roundClamped(x[i] * inverse, -127, 127) + zero, 0.0f, 127.0f)));
  std::vector<float> y;
  for (int64_t j = 0; j < w.n; ++j) {
    int64_t sum = 0;
    for (int64_t i = 0; i < w.k; ++i)
      sum += static_cast<int64_t>(q[i]) * w.q[j * w.k + i];
    const float corrected = static_cast<float>(sum) - zero * w.columnSum[j];
    y.push_back(corrected * (scale * w.scale[j]));
  }
  return y;
}

// The product of the input with W over all steps (premultiplied: the input projection), and the
// recurrent product h' = h U^T + y, whose h is quantized anew at every step.
const char* kProductsCell = R"(cell products(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size]
  y = linear(x, w)
  h2 = linear(h, u) + y
  return h = h2; output h2
})";

struct ProductShape {
  int64_t input, hidden, steps, batch;
};

// kProductsCell bound to `shape`, with random weights, inputs and initial state.
struct ProductsCase {
  std::shared_ptr<ir::Cell> cell;
  Tensor w, u, x, h0;
};

ProductsCase productsCase(const ProductShape& shape, unsigned seed) {
  ProductsCase c;
  c.cell = frontend::parseCell(kProductsCell, "products.cell");
  c.cell->bindSizes({{"input_size", shape.input}, {"hidden_size", shape.hidden}});
  std::mt19937 rng(seed);
  c.w = test::randomTensor({shape.hidden, shape.input}, rng, 0.5f);
  c.u = test::randomTensor({shape.hidden, shape.hidden}, rng, 0.5f);
  c.x = test::randomTensor({shape.steps, shape.batch, shape.input}, rng, 1.0f);
  c.h0 = test::randomTensor({shape.batch, shape.hidden}, rng, 1.0f);
  return c;
}

// kProductsCell's outputs by the reference above: y = x W^T, h' = h U^T + y at every step.
Tensor productsCellReference(const ProductShape& shape, const Tensor& w, const Tensor& u,
                             const Tensor& x, const Tensor& h0) {
  const QuantizedWeights qw = quantizeWeights(w), qu = quantizeWeights(u);
  Tensor expected({shape.steps, shape.batch, shape.hidden});
  std::vector<float> h(h0.values().begin(), h0.values().end());
  for (int64_t t = 0; t < shape.steps; ++t) {
    for (int64_t b = 0; b < shape.batch; ++b) {
      std::vector<float> y = quantizedLinear(x.data() + (t * shape.batch + b) * shape.input, qw);
      std::vector<float> r = quantizedLinear(h.data() + b * shape.hidden, qu);
      for (int64_t j = 0; j < shape.hidden; ++j)
        expected.data()[(t * shape.batch + b) * shape.hidden + j] = r[j] + y[j];
    }
    std::copy_n(expected.data() + t * shape.batch * shape.hidden, shape.batch * shape.hidden,
                h.data());
  }
  return expected;
}

TEST(Int8Products, MatchAReferenceQuantizationOnEveryTarget) {
  const ProductShape shapes[] = {{37, 21, 3, 5}, {5, 9, 2, 1}, {130, 40, 4, 17}, {1, 3, 2, 2}};
  for (const ProductShape& shape : shapes) {
    auto [cell, w, u, x, h0] =
        productsCase(shape, static_cast<unsigned>(shape.input * 7 + shape.batch));
    h0.data()[0] = 0; // rows with zeros, and (batch > 1) a row of zeros only
    if (shape.batch > 1)
      std::fill(h0.data() + shape.hidden, h0.data() + 2 * shape.hidden, 0.0f);

    const Tensor expected = productsCellReference(shape, w, u, x, h0);
    float largest = 0;
    for (float v : expected.values())
      largest = std::max(largest, std::fabs(v));

    // Whole, and a step per chunk (CompileOptions::sequenceBufferBytes; int8 runs long sequences
    // in chunks of a few steps, each chunk's rows quantized by its own pre phase).
    for (const std::string& cpu : int8Cpus())
      for (int64_t bufferBytes : {int64_t{32} << 20, int64_t{1}})
        for (int threads : {1, 2}) {
          SCOPED_TRACE("I=" + std::to_string(shape.input) + " H=" + std::to_string(shape.hidden) +
                       " B=" + std::to_string(shape.batch) + " on " +
                       (cpu.empty() ? "the host" : cpu) + ", " + std::to_string(threads) +
                       " threads, sequence buffer " + std::to_string(bufferBytes));
          CompileOptions options;
          options.targetCpu = cpu;
          options.cache.disk = false;
          options.weights = WeightType::I8;
          options.sequenceBufferBytes = bufferBytes;
          auto compiled = CompiledCell::compile(*cell, options);
          std::vector<Tensor> states = {h0};
          Tensor actual;
          CompiledCell::Workspace workspace;
          compiled->run({w, u}, {x}, states, actual, workspace, threads);
          // The same integers and the same fp32 operations: equal to rounding in the last place
          // (a different rounding of any input or weight would be off by a whole step).
          EXPECT_LT(test::maxAbsDiff(actual, expected), 2e-6f * std::max(1.0f, largest));
        }
  }
}

// The interpreter's int8 products (ExecutionOptions::int8Products: the oracle of the differential
// fuzzer's int8 cells, tests/fuzz/cells --weights-dtype int8) are the same scheme: a linear's
// weights quantized by row, a matmul's by column, NaN for a row or channel that is not finite.
TEST(Int8Products, TheInterpreterComputesTheSameScheme) {
  ExecutionOptions int8;
  int8.int8Products = true;
  const ProductShape shapes[] = {{37, 21, 3, 5}, {5, 9, 2, 1}, {1, 3, 2, 2}};
  for (const ProductShape& shape : shapes) {
    SCOPED_TRACE("I=" + std::to_string(shape.input) + " H=" + std::to_string(shape.hidden));
    auto [cell, w, u, x, h0] =
        productsCase(shape, static_cast<unsigned>(shape.input * 3 + shape.batch));
    const Tensor expected = productsCellReference(shape, w, u, x, h0);
    std::vector<Tensor> states = {h0};
    const Tensor actual = Interpreter(*cell, {w, u}, int8).run({x}, states);
    float largest = 0;
    for (float v : expected.values())
      largest = std::max(largest, std::fabs(v));
    EXPECT_LT(test::maxAbsDiff(actual, expected), 2e-6f * std::max(1.0f, largest));
    // Not the fp32 products.
    std::vector<Tensor> fp32States = {h0};
    EXPECT_GT(test::maxAbsDiff(Interpreter(*cell, {w, u}).run({x}, fp32States), expected), 1e-4f);
  }

  // A matmul's weights [K, N]: channels are columns.
  auto matmul = frontend::parseCell(R"(cell m(input_size, hidden_size) {
    input x[input_size]
    state h[hidden_size]
    param wt[input_size, hidden_size]
    y = x @ wt
    return h = y; output y
  })",
                                    "matmul.cell");
  matmul->bindSizes({{"input_size", 7}, {"hidden_size", 5}});
  std::mt19937 rng(11);
  Tensor w = test::randomTensor({5, 7}, rng, 0.5f), wt({7, 5});
  for (int64_t j = 0; j < 5; ++j)
    for (int64_t k = 0; k < 7; ++k)
      wt.data()[k * 5 + j] = w.data()[j * 7 + k];
  Tensor x = test::randomTensor({1, 3, 7}, rng, 1.0f);
  x.data()[7 + 4] = std::numeric_limits<float>::quiet_NaN(); // row 1
  std::vector<Tensor> states = {Tensor({3, 5})};
  const Tensor y = Interpreter(*matmul, {wt}, int8).run({x}, states);
  const QuantizedWeights qw = quantizeWeights(w);
  for (int64_t b = 0; b < 3; ++b) {
    const std::vector<float> expected = quantizedLinear(x.data() + b * 7, qw);
    for (int64_t j = 0; j < 5; ++j)
      if (b == 1)
        EXPECT_TRUE(std::isnan(y.data()[b * 5 + j])) << j;
      else
        EXPECT_NEAR(y.data()[b * 5 + j], expected[static_cast<size_t>(j)], 2e-6f) << b << ", " << j;
  }
}

// Every built-in cell with int8 weights on PyTorch's weights and inputs: within 3e-2 of the fp32
// output's largest value (PyTorch's own qint8 is about 1.3e-2 on the default LSTM: the Python
// tests compare the two on the same weights).
TEST(Int8Products, LayersStayCloseToFp32) {
  const std::pair<const char*, const char*> layers[] = {{"lstm", "lstm_l3_bi_len"},
                                                        {"gru", "gru_l3_uni_len"},
                                                        {"rnn_tanh", "rnn_tanh_l3_uni_len"},
                                                        {"rnn_relu", "rnn_relu_l2_uni_len"},
                                                        {"lstm_proj", "lstm_proj_l2_bi"}};
  for (const auto& [cell, fixture] : layers) {
    SCOPED_TRACE(fixture);
    const float error =
        test::relativeError(test::fixtureLayerOutput(cell, fixture, WeightType::I8),
                            test::fixtureLayerOutput(cell, fixture, WeightType::F32));
    EXPECT_GT(error, 0.0f) << "the weights were not quantized";
    EXPECT_LT(error, 3e-2f);
  }
}

// A NaN or an infinity in the input or the weights makes its results NaN, not quietly wrong.
TEST(Int8Products, NaNAndInfinityGiveNaN) {
  auto cell = frontend::parseCell(kProductsCell, "products.cell");
  cell->bindSizes({{"input_size", 6}, {"hidden_size", 4}});
  std::mt19937 rng(5);
  Tensor w = test::randomTensor({4, 6}, rng), u = test::randomTensor({4, 4}, rng);
  Tensor x = test::randomTensor({1, 3, 6}, rng);
  x.data()[2] = std::numeric_limits<float>::quiet_NaN();    // row 0
  x.data()[6 + 1] = std::numeric_limits<float>::infinity(); // row 1
  CompileOptions options;
  options.cache.disk = false;
  options.weights = WeightType::I8;
  auto compiled = CompiledCell::compile(*cell, options);
  std::vector<Tensor> states = {Tensor({3, 4})};
  Tensor y = compiled->run({w, u}, {x}, states);
  for (int64_t j = 0; j < 4; ++j) {
    EXPECT_TRUE(std::isnan(y.data()[j])) << j;
    EXPECT_TRUE(std::isnan(y.data()[4 + j])) << j;
    EXPECT_TRUE(std::isfinite(y.data()[8 + j])) << j;
  }
  x = test::randomTensor({1, 3, 6}, rng);
  w.data()[6 * 2 + 3] = -std::numeric_limits<float>::infinity(); // column 2
  states = {Tensor({3, 4})};
  y = compiled->run({w, u}, {x}, states);
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t j = 0; j < 4; ++j)
      EXPECT_EQ(std::isnan(y.data()[b * 4 + j]), j == 2) << b << ", " << j;
}

// The multiply each ISA gets: vpmaddubsw + vpmaddwd on AVX2, one vpdpbusd with VNNI (read from
// the assembly: the VNNI code runs only where the host has it).
TEST(Int8Products, VnniCpusGetVpdpbusd) {
  auto cell = frontend::loadCell("gru");
  cell->bindSizes({{"input_size", 16}, {"hidden_size", 16}});
  std::ostringstream log;
  passes::runPipeline(*cell, {}, log);
  auto assembly = [&](const std::string& cpu) {
    codegen::Target target = codegen::namedCpuTarget(cpu);
    return codegen::generate(*cell, codegen::planStorage(*cell, target, WeightType::I8), target,
                             codegen::Stage::Assembly);
  };
  const std::string avx2 = assembly("haswell");
  EXPECT_NE(avx2.find("vpmaddubsw"), std::string::npos);
  EXPECT_EQ(avx2.find("vpdpbusd"), std::string::npos);
  for (const char* cpu : {"znver4", "icelake-server", "alderlake"}) {
    const std::string vnni = assembly(cpu);
    EXPECT_NE(vnni.find("vpdpbusd"), std::string::npos) << cpu;
    EXPECT_EQ(vnni.find("vpmaddubsw"), std::string::npos) << cpu;
  }
}

TEST(Int8Products, WhatCannotWorkIsAClearError) {
  auto cell = frontend::loadCell("lstm");
  cell->bindSizes({{"input_size", 3}, {"hidden_size", 4}});
  CompileOptions baseline;
  baseline.targetCpu = "x86-64";
  baseline.cache.disk = false;
  baseline.weights = WeightType::I8;
  test::expectUserError([&] { CompiledCell::compile(*cell, baseline); },
                        {"int8 weights need AVX2, which CPU 'x86-64' lacks"});
  // A cell with no matrix product: nothing to quantize.
  auto elementwise = frontend::parseCell(R"(cell gate(input_size) {
  input x[input_size]
  state h[input_size]
  y = tanh(x * sigmoid(h))
  return h = y; output y
})",
                                         "gate.cell");
  elementwise->bindSizes({{"input_size", 4}});
  CompileOptions host;
  host.cache.disk = false;
  host.weights = WeightType::I8;
  test::expectUserError([&] { CompiledCell::compile(*elementwise, host); },
                        {"cell 'gate' has no linear or matmul with parameter weights: int8 "
                         "weights would change nothing"});
  std::mt19937 rng(3);
  cell = frontend::loadCell("lstm");
  TensorMap weights = test::randomWeights(*cell, {{"input_size", 3}, {"hidden_size", 4}}, rng);
  LayerOptions training;
  training.training = true;
  training.compile.weights = WeightType::I8;
  test::expectUserError([&] { LayerProgram::build(*cell, weights, "weights", training); },
                        {"int8 weights are for inference: train in fp32, bf16 or fp16, then "
                         "run the trained weights as int8"});
}

} // namespace

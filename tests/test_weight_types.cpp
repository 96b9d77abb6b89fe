// Reduced-precision weights (--weights-dtype bf16|fp16, codegen/WeightType.h): the packed weights
// are the fp32 ones rounded to nearest even, bit for bit as Eigen's half and bfloat16 round them
// (read back through a product with one-hot inputs); every built-in cell with them matches the
// interpreter run on weights rounded the same way, on every target this host runs, at awkward
// sizes and at batch 1; against fp32 the error stays within 1e-2 of the output's range; and
// what cannot work is a clear error.
#include "codegen/HostTarget.h"
#include "codegen/Target.h"
#include "codegen/WeightType.h"
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "ir/Error.h"
#include "runtime/data/Npy.h"
#include "runtime/data/SafeTensors.h"
#include "runtime/exec/CompiledCell.h"
#include "runtime/exec/Interpreter.h"
#include "runtime/layers/Gradients.h"
#include "runtime/layers/LayerRunner.h"
#include "tests/LayerOutputs.h"
#include "tests/RandomTensors.h"
#include "tests/RunnableCpus.h"
#include "tests/TestSupport.h"

#include <Eigen/Core>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

using namespace rnnc;
using codegen::WeightType;

namespace {

using test::runnableCpus;

// The oracle's rounding: Eigen's, not ours.
float rounded(float v, WeightType type) {
  switch (type) {
  case WeightType::F32:
    return v;
  case WeightType::F16:
    return static_cast<float>(Eigen::half(v));
  case WeightType::BF16:
    return static_cast<float>(Eigen::bfloat16(v));
  case WeightType::I8:
    break; // quantized, not rounded: tests/test_int8_products.cpp
  }
  ADD_FAILURE() << "no rounding for int8";
  return v;
}

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// The cell's matrices (every rank-2 parameter: what linear and matmul read) rounded.
std::vector<Tensor> withRoundedMatrices(std::vector<Tensor> params, WeightType type) {
  for (Tensor& p : params)
    if (p.rank() == 2)
      for (float& v : p.values())
        v = rounded(v, type);
  return params;
}

// y = x W^T with x one-hot: row b of the output is column b of W^T, i.e. W's weights for input
// b exactly as the kernel read them.
const char* kProbeCell = R"(cell probe(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size]
  y = linear(x, w)
  return h = y; output y
})";

TEST(WeightTypes, PackedWeightsAreRoundedToNearestEvenLikeEigen) {
  // Ties in both formats, values past fp16's range, fp16 subnormals and NaN; then random values.
  std::vector<float> special = {1.0f,
                                1.0f + std::ldexp(1.0f, -8),     // bf16 tie, to even (down)
                                1.0f + 3 * std::ldexp(1.0f, -8), // bf16 tie, to even (up)
                                1.0f + std::ldexp(1.0f, -11),    // fp16 tie
                                -3.14159265f,
                                65504.0f,
                                70000.0f, // fp16: infinity
                                1e30f,
                                -1e-6f, // fp16 subnormal
                                1e-9f,  // fp16: zero
                                std::numeric_limits<float>::quiet_NaN(),
                                -std::numeric_limits<float>::infinity()};
  const int64_t inputs = 13, hidden = static_cast<int64_t>(special.size()) + 7;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  Tensor w({hidden, inputs});
  for (int64_t i = 0; i < w.numel(); ++i)
    w.data()[i] = i < static_cast<int64_t>(special.size()) * inputs
                      ? special[i / inputs] * (1 - static_cast<float>(i % inputs) / 64)
                      : dist(rng);
  Tensor x({1, inputs, inputs});
  for (int64_t b = 0; b < inputs; ++b)
    x.data()[b * inputs + b] = 1.0f;
  auto cell = frontend::parseCell(kProbeCell, "probe.cell");
  cell->bindSizes({{"input_size", inputs}, {"hidden_size", hidden}});
  for (const std::string& cpu : runnableCpus())
    for (WeightType type : {WeightType::F16, WeightType::BF16}) {
      SCOPED_TRACE(cpu + ", " + std::string(codegen::weightTypeName(type)));
      CompileOptions options;
      options.targetCpu = cpu;
      options.cache.disk = false;
      options.weights = type;
      std::vector<Tensor> states = {Tensor({inputs, hidden})};
      Tensor y = CompiledCell::compile(*cell, options)->run({w}, {x}, states);
      for (int64_t b = 0; b < inputs; ++b)
        for (int64_t j = 0; j < hidden; ++j) {
          // The one term with x = 1, the others 0 * w: +-0, or NaN where w is infinite or NaN
          // (fp16's 70000 and 1e30 are infinities).
          float expected = 0;
          for (int64_t k = 0; k < inputs; ++k)
            expected = std::fma(x.data()[b * inputs + k], rounded(w.data()[j * inputs + k], type),
                                expected);
          const float weight = w.data()[j * inputs + b], actual = y.data()[b * hidden + j];
          if (std::isnan(expected))
            EXPECT_TRUE(std::isnan(actual)) << weight;
          else
            EXPECT_EQ(bits(actual), bits(expected)) << weight << " read back as " << actual;
        }
    }
}

struct CellShape {
  int64_t input, hidden, steps, batch;
};

// Built-in cell `name` of this shape, compiled for `cpu` with `type` weights, against the
// interpreter on the same rounded operands. Returns the compiled cell, whose plan a test may check.
std::shared_ptr<CompiledCell>
expectBuiltinCellMatchesTheInterpreter(const std::string& name, const CellShape& shape,
                                       const std::string& cpu, WeightType type,
                                       float tolerance = 2e-5f, bool widenFp16 = false) {
  SCOPED_TRACE(name + " I=" + std::to_string(shape.input) + " H=" + std::to_string(shape.hidden) +
               " B=" + std::to_string(shape.batch) + " on " + cpu + ", " +
               std::string(codegen::weightTypeName(type)) + (widenFp16 ? " widened" : ""));
  auto cell = frontend::loadCell(name);
  ir::SizeMap sizes;
  for (const std::string& size : cell->sizeNames)
    sizes[size] = size == "input_size"    ? shape.input
                  : size == "hidden_size" ? shape.hidden
                                          : shape.hidden - 3; // proj_size
  cell->bindSizes(sizes);
  std::mt19937 rng(static_cast<unsigned>(shape.input * 131 + shape.batch));
  std::vector<Tensor> params = test::randomParams(*cell, cell->sizes, rng);
  std::vector<Tensor> inputs = {
      test::randomTensor({shape.steps, shape.batch, shape.input}, rng, 1.0f)};
  std::vector<Tensor> states;
  for (const auto& state : cell->states)
    states.push_back(
        test::randomTensor({shape.batch, *state->shape[1].evaluate(cell->sizes)}, rng));
  std::vector<Tensor> expectedStates = states;
  // bf16 products multiply bf16 inputs too (codegen/Bf16Products.cpp).
  ExecutionOptions reference;
  reference.bf16Products = type == WeightType::BF16;
  Tensor expected =
      Interpreter(*cell, withRoundedMatrices(params, type), reference).run(inputs, expectedStates);
  CompileOptions options;
  options.targetCpu = cpu;
  options.cache.disk = false;
  options.weights = type;
  // These sizes' step weights all fit in L2: fp16 tiles are kept unless asked otherwise.
  options.widenCachedFp16 = widenFp16;
  std::shared_ptr<CompiledCell> compiled = CompiledCell::compile(*cell, options);
  const bool widened =
      std::any_of(compiled->plan().packedProducts.begin(), compiled->plan().packedProducts.end(),
                  [](const auto& packed) { return packed.widenedFrom == WeightType::F16; });
  EXPECT_EQ(widened, widenFp16 && type == WeightType::F16 &&
                         !codegen::runnableTarget(cpu).widensFp16BesideFmas());
  Tensor actual = compiled->run(params, inputs, states);
  EXPECT_LT(test::maxAbsDiff(actual, expected), tolerance);
  for (size_t i = 0; i < states.size(); ++i)
    EXPECT_LT(test::maxAbsDiff(states[i], expectedStates[i]), tolerance) << "state " << i;
  return compiled;
}

TEST(WeightTypes, EveryBuiltinCellMatchesTheInterpreterOnRoundedOperands) {
  // Sizes no tile or vector divides, an odd depth, batch 1 (single-row tiles with the depth
  // split between accumulator sets) and T = 1.
  const CellShape shapes[] = {{7, 11, 4, 13}, {33, 19, 3, 1}, {5, 8, 1, 2}};
  // The host's own CPU too: its code may differ from the named CPUs' (Zen 4 widens fp16 single
  // rows in halves).
  std::vector<std::string> cpus = runnableCpus();
  cpus.push_back("");
  // vdpbf16ps's tiles (Target::pairsBf16Products) on any host with AVX512_BF16: an Intel host
  // itself widens bf16 weights, Zen 4's code pairs them.
  if (codegen::detectHostTarget().has("avx512bf16"))
    cpus.push_back("znver4");
  for (const std::string& name : frontend::builtinCellNames())
    for (const CellShape& shape : shapes)
      for (const std::string& cpu : cpus)
        for (WeightType type : {WeightType::F16, WeightType::BF16})
          expectBuiltinCellMatchesTheInterpreter(name, shape, cpu, type);
}

// fp16 weights widened to fp32 at packing where the step's fp32 weights fit in L2
// (PackedProduct::widenedFrom; every size here): fp32 tiles on the fp16 values, so the same
// results as the interpreter's on the rounded weights. AVX-512 (the host, and Skylake's code,
// which widens at packing also on an AMD host, whose own code keeps fp16 tiles) and AVX2 code.
TEST(WeightTypes, Fp16WeightsWidenedAtPackingMatchTheInterpreter) {
  std::vector<std::string> cpus = {"", "haswell"};
  if (codegen::detectHostTarget().has("avx512f"))
    cpus.push_back("skylake-avx512");
  for (const std::string& name : frontend::builtinCellNames())
    for (const CellShape& shape : {CellShape{7, 11, 4, 13}, CellShape{33, 19, 3, 1}})
      for (const std::string& cpu : cpus)
        expectBuiltinCellMatchesTheInterpreter(name, shape, cpu, WeightType::F16, 2e-5f,
                                               /*widenFp16=*/true);
}

// A step's fp16 and bf16 weights past L2 are packed with every slice in one panel
// (codegen/StoragePlan.cpp; within L2, as the sizes above, a panel per pass): the LSTM's four
// gates at H = 1024, 8 MB of 2-byte W_hh, past the L2 of every x86-64 core we run on. A single
// row (batch 1) reads them as one stream, a tile of 9 rows two slices a pass. The host's code,
// AVX2's (fp16 and bf16 widened as they are loaded) and, where the host has AVX512_BF16, Zen 4's
// bf16 pairs (vdpbf16ps). (AMX tiles keep their own packing.)
TEST(WeightTypes, StepWeightsPastL2InOnePanelMatchTheInterpreter) {
  std::vector<std::string> cpus = {"", "haswell"};
  if (codegen::detectHostTarget().has("avx512bf16"))
    cpus.push_back("znver4");
  for (const std::string& cpu : cpus)
    for (WeightType type : {WeightType::F16, WeightType::BF16})
      for (int64_t batch : {1, 9}) {
        const std::shared_ptr<CompiledCell> compiled = expectBuiltinCellMatchesTheInterpreter(
            "lstm", CellShape{24, 1024, 2, batch}, cpu, type, 5e-5f);
        int steps = 0;
        for (const codegen::PackedProduct& packed : compiled->plan().packedProducts)
          if (!packed.splitRows) {
            ++steps;
            EXPECT_EQ(packed.weights, type);
            // AMX tiles (bf16 on a CPU with AMX-BF16) keep their own packing.
            EXPECT_EQ(packed.panelSlices, packed.amxTiles ? packed.passSlices : 4)
                << "on " << cpu << " at batch " << batch;
          }
        EXPECT_EQ(steps, 1) << "on " << cpu;
      }
}

// Batches past one AMX tile of rows (16): on a CPU with AMX-BF16 the host's code multiplies
// tiles of two AMX tiles of 16 rows (codegen/AmxTiles.cpp), the second shorter at B = 17 and 37
// (a full tile of 32, then 5 rows), and the depth (I = 45, H = 40) no whole number of AMX tiles.
// The same shapes on vdpbf16ps (znver4 code, where the host has AVX512_BF16) and widened (AVX2).
// The GRU at B = 37 is 2.4e-5 from the interpreter on all three: the order of its sums.
TEST(WeightTypes, Bf16StepsOfMoreRowsThanAnAmxTileMatchTheInterpreter) {
  std::vector<std::string> cpus = {"", "haswell"};
  if (codegen::detectHostTarget().has("avx512bf16"))
    cpus.push_back("znver4");
  for (const char* name : {"lstm", "gru", "rnn_tanh"})
    for (int64_t batch : {17, 37})
      for (const std::string& cpu : cpus)
        expectBuiltinCellMatchesTheInterpreter(name, CellShape{45, 40, 3, batch}, cpu,
                                               WeightType::BF16, 5e-5f);
}

// A vanilla RNN's recurrent product at H = 530: with 2-byte weights AVX2's block of 4 vectors
// over the depth (530 x 32 x 2 bytes) outgrows L1, so its blocks are 2 vectors wide in 6-row
// tiles (codegen/StoragePlan.cpp); 9 rows are a full tile and a run-time-height one, 1 row a
// single-row tile, and 530 columns 33 blocks and 2 columns.
TEST(WeightTypes, AvxTwoRecurrentBlocksOfTwoVectorsMatchTheInterpreter) {
  for (int64_t batch : {1, 9})
    for (WeightType type : {WeightType::F16, WeightType::BF16})
      expectBuiltinCellMatchesTheInterpreter("rnn_tanh", CellShape{5, 530, 2, batch}, "haswell",
                                             type);
}

// A product's weight made of parameters is stored reduced as a parameter is, on every pipeline:
// with --no-premul too, where it had stayed in the loop, computed per step and multiplied in
// fp32 (passes/HoistParameters.h). The interpreter rounds every product's weight, made or given.
// The weight is made exactly (0.5 * u - v, the same bits on both engines): a function that the
// JIT approximates otherwise than the C library (tanh) could tip a weight's rounding to fp16
// (one of them did, by 3e-5, in the sanitizers' build).
TEST(WeightTypes, AWeightMadeOfParametersIsReducedWithAndWithoutPremultiply) {
  auto cell = frontend::parseCell(R"(cell d(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size], v[hidden_size, hidden_size]
  h2 = tanh(linear(x, w) + linear(h, 0.5 * u - v))
  return h = h2; output h2
})",
                                  "derived.cell");
  cell->bindSizes({{"input_size", 9}, {"hidden_size", 13}});
  std::mt19937 rng(17);
  std::vector<Tensor> params = test::randomParams(*cell, cell->sizes, rng);
  std::vector<Tensor> inputs = {test::randomTensor({5, 3, 9}, rng, 1.0f)};
  const std::vector<Tensor> initial = {test::randomTensor({3, 13}, rng)};
  for (WeightType type : {WeightType::F16, WeightType::BF16})
    for (bool premultiply : {true, false}) {
      SCOPED_TRACE(std::string(codegen::weightTypeName(type)) +
                   (premultiply ? "" : ", --no-premul"));
      ExecutionOptions reference;
      reference.f16Weights = type == WeightType::F16;
      reference.bf16Products = type == WeightType::BF16;
      std::vector<Tensor> expectedStates = initial, states = initial;
      Tensor expected = Interpreter(*cell, params, reference).run(inputs, expectedStates);
      CompileOptions options;
      options.cache.disk = false;
      options.weights = type;
      options.pipeline.premultiply = premultiply;
      Tensor actual = CompiledCell::compile(*cell, options)->run(params, inputs, states);
      EXPECT_LT(test::maxAbsDiff(actual, expected), 2e-5f);
      // Against fp32 weights the difference is the rounding's, far above the bound above.
      std::vector<Tensor> fp32States = initial;
      EXPECT_GT(test::maxAbsDiff(Interpreter(*cell, params).run(inputs, fp32States), expected),
                1e-4f);
    }
}

// Layers with PyTorch's weights and inputs (tests/fixtures/layers), reduced against fp32: within
// 1e-2 of the fp32 output's largest value (the issue's bound), fp16 closer than bf16 (3 more
// bits of mantissa). Several layers and both directions: the error compounds through them.
TEST(WeightTypes, LayersStayWithinTheErrorBoundOfFp32) {
  const std::pair<const char*, const char*> layers[] = {{"lstm", "lstm_l3_bi_len"},
                                                        {"gru", "gru_l3_uni_len"},
                                                        {"rnn_tanh", "rnn_tanh_l3_uni_len"},
                                                        {"lstm_proj", "lstm_proj_l2_bi"}};
  for (const auto& [cell, fixture] : layers) {
    SCOPED_TRACE(fixture);
    const Tensor fp32 = test::fixtureLayerOutput(cell, fixture, WeightType::F32);
    const float fp16Error =
        test::relativeError(test::fixtureLayerOutput(cell, fixture, WeightType::F16), fp32);
    const float bf16Error =
        test::relativeError(test::fixtureLayerOutput(cell, fixture, WeightType::BF16), fp32);
    EXPECT_LT(bf16Error, 1e-2f);
    EXPECT_LT(fp16Error, 1e-2f);
    EXPECT_LT(fp16Error, bf16Error);
    EXPECT_GT(bf16Error, 0.0f) << "the weights were not reduced";
  }
}

TEST(WeightTypes, WhatCannotWorkIsAClearError) {
  EXPECT_EQ(codegen::parseWeightType("bfloat16"), WeightType::BF16);
  EXPECT_EQ(codegen::parseWeightType("fp16"), WeightType::F16);
  EXPECT_EQ(codegen::parseWeightType("qint8"), WeightType::I8);
  test::expectUserError([] { codegen::parseWeightType("fp8"); },
                        {"unknown weights dtype 'fp8': expected fp32, bf16, fp16 or int8"});

  auto cell = frontend::loadCell("gru");
  cell->bindSizes({{"input_size", 3}, {"hidden_size", 4}});
  // x86-64 without F16C: fp16 would need a conversion routine the JIT does not link.
  CompileOptions baseline;
  baseline.targetCpu = "x86-64";
  baseline.cache.disk = false;
  baseline.weights = WeightType::F16;
  test::expectUserError([&] { CompiledCell::compile(*cell, baseline); },
                        {"fp16 weights need F16C, which CPU 'x86-64' lacks"});
  baseline.weights = WeightType::BF16; // plain integer code: runs anywhere
  EXPECT_NO_THROW(CompiledCell::compile(*cell, baseline));

  std::mt19937 rng(3);
  cell = frontend::loadCell("gru");
  TensorMap weights = test::randomWeights(*cell, {{"input_size", 3}, {"hidden_size", 4}}, rng);
  // Training takes bf16 and fp16 (tests/test_mixed_precision_training.cpp), not int8.
  for (auto engine : {Engine::Interpreter, Engine::Jit}) {
    LayerOptions options;
    options.engine = engine;
    options.training = true;
    options.compile.weights = WeightType::I8;
    test::expectUserError([&] { LayerProgram::build(*cell, weights, "weights", options); },
                          {"int8 weights are for inference: train in fp32, bf16 or fp16, then run "
                           "the trained weights as int8"});
  }
  // A cell whose products have no weights: on the interpreter too.
  auto elementwise = frontend::parseCell(R"(cell scale(input_size) {
  input x[input_size]
  state h[input_size]
  param a[input_size]
  return h = tanh(x + a * h); output h
})",
                                         "scale.cell");
  LayerOptions interpreted;
  interpreted.engine = Engine::Interpreter;
  interpreted.compile.weights = WeightType::F16;
  test::expectUserError(
      [&] {
        LayerProgram::build(*elementwise,
                            test::randomWeights(*elementwise, {{"input_size", 3}}, rng), "weights",
                            interpreted);
      },
      {"cell 'scale' has no linear or matmul with parameter weights: fp16 weights would change "
       "nothing"});
}

// The interpreter engine runs reduced weights as the generated code computes them (bf16's
// operands rounded, fp16's weights, int8's quantized products: withProductsAs), in its own way:
// a layer's output on it matches the JIT's, and differs from fp32's by the rounding.
TEST(WeightTypes, TheInterpreterRunsReducedWeightsAsTheJit) {
  const std::pair<const char*, const char*> layers[] = {{"lstm", "lstm_l3_bi_len"},
                                                        {"gru", "gru_l3_uni_len"}};
  for (const auto& [cell, fixture] : layers)
    for (WeightType type : {WeightType::BF16, WeightType::F16, WeightType::I8}) {
      SCOPED_TRACE(std::string(fixture) + ", " + std::string(codegen::weightTypeName(type)));
      const Tensor jit = test::fixtureLayerOutput(cell, fixture, type);
      const Tensor interpreted = test::fixtureLayerOutput(cell, fixture, type, Engine::Interpreter);
      const Tensor fp32 = test::fixtureLayerOutput(cell, fixture, WeightType::F32);
      EXPECT_LT(test::relativeError(interpreted, jit), 1e-5f);
      EXPECT_GT(test::relativeError(interpreted, fp32), 1e-4f);
    }
}

} // namespace

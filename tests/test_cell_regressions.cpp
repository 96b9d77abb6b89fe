// Cells that once stopped with an internal error in some pass setting while the interpreter ran
// them (issue 13's reproductions), and every built-in cell, run by the JIT under every pass
// setting, on 1 and 2 threads, against the interpreter.
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "passes/Autodiff.h"
#include "passes/PassManager.h"
#include "runtime/SequenceRunner.h"
#include "tests/PassSettings.h"
#include "tests/TestSupport.h"

#include <gtest/gtest.h>

#include <random>

using namespace rnnc;

namespace {

// A bias-free input projection chunked and read raw inside the step: premultiply leaves a pre
// kernel of slices only ("no storage for a value the generated code reads").
const char* kRawChunks = R"(cell raw_chunks(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[2*hidden_size, input_size], u[hidden_size, hidden_size]
  a, b = chunk(x @ w^T, 2)
  h2 = tanh(a + h @ u^T) * b
  return h = h2; output h2
})";

// A minimal gated unit: without premultiply, fuse-matmul pulled the stacked input projection
// into the first kernel while its second slice was read by the next kernel.
const char* kMinimalGatedUnit = R"(cell mgu(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w_f[hidden_size, input_size], u_f[hidden_size, hidden_size], b_f[hidden_size]
  param w_h[hidden_size, input_size], u_h[hidden_size, hidden_size], b_h[hidden_size]
  f = sigmoid(linear(x, w_f, b_f) + linear(h, u_f))
  hc = tanh(linear(x, w_h, b_h) + linear(f * h, u_h))
  h2 = (1 - f) * h + f * hc
  return h = h2; output h2
})";

// Two products of one operand by weights stored as `x @ W` ([K, N]): merge-gates makes them one
// product by the weights concatenated along N, which the backward of every linear cell has
// (dh W_hh and dh W_ih from one dgates). The JIT stored such weights wrongly once.
const char* kMergedMatMuls = R"(cell merged_matmuls(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w_h[hidden_size, hidden_size], w_x[hidden_size, input_size]
  g = tanh(x @ w_x^T + h)
  p = g @ w_h
  q = g @ w_x
  h2 = tanh(p) * sigmoid(h)
  return h = h2; output q
})";

// A state whose next value is a chunk of a product read raw, in a kernel of views only: the
// storage plan had the kernel store it over the state, and a views-only kernel emits no code,
// so the state never changed. The backward step of every linear cell has this shape (the
// gradient of h is a chunk of dgates [W_hh | W_ih]).
const char* kRawChunkState = R"(cell raw_chunk_state(hidden_size) {
  input gy[hidden_size]
  state d[hidden_size]
  param w[2*hidden_size, hidden_size]
  a, b = chunk(linear(gy + d, w), 2)
  return d = a; output b
})";

// Found by the fuzzer: one value the next value of two states, where the kernel could store it
// over one state (h, read nowhere) but not the other (c, read by the products); the plan kept it
// in registers, and c's update read a value with no storage.
const char* kOneValueTwoStates = R"(cell one_value_two_states(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size], c[hidden_size]
  param w[3*hidden_size, hidden_size], b[3*hidden_size], u[4*hidden_size, hidden_size]
  param v[hidden_size, input_size]
  g1, g2, g3 = chunk(c @ w^T + b, 3)
  q1, q2, q3, q4 = chunk(c @ u^T, 4)
  n = g2 + x @ v^T
  return h = n, c = n; output q3
})";

const char* kBackwardLike = R"(cell backward_like(input_size, hidden_size) {
  input x[input_size], gy[hidden_size], m[hidden_size]
  state d[hidden_size]
  param w_ih[hidden_size, input_size], w_hh[hidden_size, hidden_size]
  g = (gy + d) * m
  a = g @ w_hh
  b = g @ w_ih
  o = cat(b, x, g, g)
  return d = a; output o
})";

// Runs `cell` on random weights, inputs and initial states under every setting and thread count,
// against the interpreter.
void expectEverySettingMatchesTheInterpreter(const ir::Cell& cell) {
  std::mt19937 rng(3);
  const ir::SizeMap all = {{"input_size", 5}, {"hidden_size", 9}, {"proj_size", 4}};
  ir::SizeMap sizes;
  for (const std::string& name : cell.sizeNames)
    sizes[name] = all.at(name);
  TensorMap weights = test::randomWeights(cell, sizes, rng);
  SequenceRequest request;
  request.weights = &weights;
  request.sizes = sizes;
  for (const auto& input : cell.inputs)
    request.inputs[input->name] =
        test::randomTensor({4, 3, *input->shape[1].evaluate(sizes)}, rng, 1.0f);
  for (const auto& state : cell.states)
    request.initialStates[state->name] =
        test::randomTensor({1, 3, *state->shape[1].evaluate(sizes)}, rng);
  request.engine = Engine::Interpreter;
  SequenceResult expected = runSequence(cell, request);
  request.engine = Engine::Jit; // the disk cache (the tests' own) spares the second thread count
  for (const test::PassSetting& setting : test::everyPassSetting())
    for (int threads : {1, 2}) {
      SCOPED_TRACE(cell.name + ", " + setting.name + ", " + std::to_string(threads) + " threads");
      request.compile.pipeline = setting.pipeline;
      request.threads = threads;
      SequenceResult actual = runSequence(cell, request);
      ASSERT_EQ(actual.engine, Engine::Jit);
      EXPECT_LT(test::maxAbsDiff(actual.output, expected.output), 1e-5);
      for (const auto& [name, state] : expected.finalStates)
        EXPECT_LT(test::maxAbsDiff(actual.finalStates.at(name), state), 1e-5) << name;
    }
}

TEST(CellRegressions, ReproductionsRunUnderEveryPassSetting) {
  for (const auto& [name, source] :
       {std::pair{"raw_chunks", kRawChunks}, std::pair{"mgu", kMinimalGatedUnit},
        std::pair{"merged_matmuls", kMergedMatMuls}, std::pair{"backward_like", kBackwardLike},
        std::pair{"raw_chunk_state", kRawChunkState},
        std::pair{"one_value_two_states", kOneValueTwoStates}})
    expectEverySettingMatchesTheInterpreter(
        *frontend::parseCell(source, std::string(name) + ".cell"));
}

// The cells in cells/ (the README's LSTM among them).
TEST(CellRegressions, EveryBuiltinCellRunsUnderEveryPassSetting) {
  for (const std::string& name : frontend::builtinCellNames())
    expectEverySettingMatchesTheInterpreter(*frontend::loadCell(name));
}

} // namespace

namespace {

// The backward step of every built-in cell (passes/Autodiff.h) is a cell like any other: the JIT
// runs it under every pass setting as the interpreter does.
TEST(CellRegressions, EveryBuiltinCellsBackwardRunsUnderEveryPassSetting) {
  for (const std::string& name : frontend::builtinCellNames())
    expectEverySettingMatchesTheInterpreter(
        *passes::deriveBackward(*frontend::loadCell(name)).cell);
}

} // namespace

// Cells with several inputs (issue 13): the first input is the layer's, the others are side
// inputs every layer and direction reads at the same step. Checked against an oracle that runs
// each sequence alone on the interpreter, one layer and direction at a time, reversing the
// sequence (all of its inputs) by hand for the backward direction; through the layer runner
// (JIT and interpreter, stacked, bidirectional, variable length, batch_first), the C++ API and
// `rnnc run --input NAME=FILE`.
#include "frontend/CellParser.h"
#include "ir/Error.h"
#include "rnnc/rnnc.h"
#include "runtime/data/Npy.h"
#include "runtime/layers/LayerRunner.h"
#include "tests/RunSequence.h"
#include "tests/TestSupport.h"
#include "tests/ToolRunner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

namespace rnnc {
namespace {

// An Elman cell fed by an attention context beside its input, and an update gate read raw from
// a second side input (as an AUGRU's attention score scales its update).
const char* kContextCell = R"(cell ctx_rnn(input_size, context_size, hidden_size) {
  input x[input_size], ctx[context_size], score[hidden_size]
  state h[hidden_size]
  param weight_ih[hidden_size, input_size], weight_ch[hidden_size, context_size]
  param weight_hh[hidden_size, hidden_size], bias_ih[hidden_size]
  cand = tanh(linear(x, weight_ih, bias_ih) + linear(ctx, weight_ch) + linear(h, weight_hh))
  a = sigmoid(score)
  h2 = a * cand + (1 - a) * h
  return h = h2; output h2
})";

constexpr int64_t kInput = 5, kContext = 3, kHidden = 6;

struct Problem {
  std::shared_ptr<ir::Cell> cell;
  TensorMap weights; // PyTorch layer names: weight_ih_l0, weight_ih_l0_reverse, ...
  Tensor x, ctx, score;
  std::vector<int64_t> lengths;
  int layers = 2, directions = 2;
};

Problem makeProblem(int64_t steps, int64_t batch, uint32_t seed) {
  Problem p;
  p.cell = frontend::parseCell(kContextCell, "ctx_rnn.cell");
  std::mt19937 rng(seed);
  for (int layer = 0; layer < p.layers; ++layer)
    for (int d = 0; d < p.directions; ++d) {
      std::string suffix = "_l" + std::to_string(layer) + (d ? "_reverse" : "");
      int64_t in = layer == 0 ? kInput : kHidden * p.directions;
      p.weights["weight_ih" + suffix] = test::randomTensor({kHidden, in}, rng, 0.5f);
      p.weights["weight_ch" + suffix] = test::randomTensor({kHidden, kContext}, rng, 0.5f);
      p.weights["weight_hh" + suffix] = test::randomTensor({kHidden, kHidden}, rng, 0.5f);
      p.weights["bias_ih" + suffix] = test::randomTensor({kHidden}, rng);
    }
  p.x = test::randomTensor({steps, batch, kInput}, rng, 1.0f);
  p.ctx = test::randomTensor({steps, batch, kContext}, rng, 1.0f);
  p.score = test::randomTensor({steps, batch, kHidden}, rng, 2.0f);
  for (int64_t b = 0; b < batch; ++b)
    p.lengths.push_back(1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(steps)));
  p.lengths[0] = steps;
  return p;
}

// Rows t of sequence b of a [T, B, F] tensor, for t in `times`, as [len, 1, F].
Tensor gather(const Tensor& t, int64_t b, const std::vector<int64_t>& times) {
  const int64_t batch = t.dim(1), f = t.dim(2);
  Tensor out({static_cast<int64_t>(times.size()), 1, f});
  for (size_t i = 0; i < times.size(); ++i)
    std::copy(t.data() + (times[i] * batch + b) * f, t.data() + (times[i] * batch + b + 1) * f,
              out.data() + static_cast<int64_t>(i) * f);
  return out;
}

// The oracle: each sequence alone, each layer and direction alone, on the interpreter.
struct Expected {
  Tensor output; // [T, B, D*H], zero past each length
  Tensor hn;     // [L*D, B, H]
};

Expected oracle(const Problem& p) {
  const int64_t steps = p.x.dim(0), batch = p.x.dim(1);
  Expected e{Tensor({steps, batch, p.directions * kHidden}),
             Tensor({p.layers * p.directions, batch, kHidden})};
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = p.lengths[b];
    std::vector<int64_t> forward(static_cast<size_t>(len));
    for (int64_t t = 0; t < len; ++t)
      forward[t] = t;
    Tensor layerInput = gather(p.x, b, forward); // [len, 1, F]
    for (int layer = 0; layer < p.layers; ++layer) {
      Tensor next({len, 1, p.directions * kHidden});
      for (int d = 0; d < p.directions; ++d) {
        std::vector<int64_t> order = forward, local = forward;
        if (d == 1) {
          std::reverse(order.begin(), order.end());
          std::reverse(local.begin(), local.end());
        }
        TensorMap weights;
        std::string suffix = "_l" + std::to_string(layer) + (d ? "_reverse" : "");
        for (const char* name : {"weight_ih", "weight_ch", "weight_hh", "bias_ih"})
          weights[name] = p.weights.at(name + suffix);
        SequenceRequest request;
        request.weights = &weights;
        request.engine = Engine::Interpreter;
        request.inputs["x"] = gather(layerInput, 0, local);
        request.inputs["ctx"] = gather(p.ctx, b, order);
        request.inputs["score"] = gather(p.score, b, order);
        SequenceResult r = runSequence(*p.cell, request);
        for (int64_t i = 0; i < len; ++i)
          std::copy(r.output.data() + i * kHidden, r.output.data() + (i + 1) * kHidden,
                    next.data() + local[i] * p.directions * kHidden + d * kHidden);
        const Tensor& h = r.finalStates.at("h");
        std::copy(h.data(), h.data() + kHidden,
                  e.hn.data() + ((layer * p.directions + d) * batch + b) * kHidden);
      }
      layerInput = next;
    }
    for (int64_t t = 0; t < len; ++t)
      std::copy(layerInput.data() + t * p.directions * kHidden,
                layerInput.data() + (t + 1) * p.directions * kHidden,
                e.output.data() + (t * batch + b) * p.directions * kHidden);
  }
  return e;
}

LayerOptions layerOptions(Engine engine) {
  LayerOptions options;
  options.engine = engine;
  options.threads = 1;
  options.compile.cache.disk = false;
  return options;
}

TEST(SideInputs, LayersMatchEachSequenceRunAlone) {
  Problem p = makeProblem(7, 4, 11);
  Expected expected = oracle(p);
  for (Engine engine : {Engine::Jit, Engine::Interpreter}) {
    SCOPED_TRACE(engine == Engine::Jit ? "jit" : "interpreter");
    auto program = LayerProgram::build(*p.cell, p.weights, "weights", layerOptions(engine));
    EXPECT_EQ(program->sideInputNames(), (std::vector<std::string>{"ctx", "score"}));
    EXPECT_EQ(program->sideInputSize("ctx"), kContext);
    LayerResult r =
        program->run(p.x, {}, Int64Array{{4}, p.lengths}, {{"ctx", p.ctx}, {"score", p.score}});
    EXPECT_LT(test::maxAbsDiff(r.output, expected.output), 1e-5);
    EXPECT_LT(test::maxAbsDiff(r.finalStates.at("h"), expected.hn), 1e-5);
  }
}

// [T, B, F] -> [B, T, F].
Tensor batchFirst(const Tensor& t) {
  const int64_t steps = t.dim(0), batch = t.dim(1), f = t.dim(2);
  Tensor out({batch, steps, f});
  for (int64_t s = 0; s < steps; ++s)
    for (int64_t b = 0; b < batch; ++b)
      std::copy(t.data() + (s * batch + b) * f, t.data() + (s * batch + b + 1) * f,
                out.data() + (b * steps + s) * f);
  return out;
}

TEST(SideInputs, TheApiTakesThemByNameBatchFirst) {
  Problem p = makeProblem(5, 3, 12);
  Expected expected = oracle(p);
  std::map<std::string, WeightTensor> weights;
  for (const auto& [name, t] : p.weights)
    weights[name] = {t.shape(), std::vector<float>(t.data(), t.data() + t.numel())};
  std::string cellPath = testing::TempDir() + "ctx_rnn_" + std::to_string(::getpid()) + ".cell";
  std::ofstream(cellPath) << kContextCell;
  LayerSpec spec;
  spec.cell = cellPath;
  spec.batchFirst = true;
  spec.threads = 2;
  Layer layer = Layer::fromWeights(spec, weights);
  std::filesystem::remove(cellPath);
  Tensor x = batchFirst(p.x), ctx = batchFirst(p.ctx), score = batchFirst(p.score);
  Tensor out({3, 5, 2 * kHidden}), hn({4, 3, kHidden});
  layer.forward(x.data(), {{"ctx", ctx.data()}, {"score", score.data()}}, 5, 3, nullptr, nullptr,
                p.lengths.data(), out.data(), hn.data(), nullptr);
  EXPECT_LT(test::maxAbsDiff(out, batchFirst(expected.output)), 1e-5);
  EXPECT_LT(test::maxAbsDiff(hn, expected.hn), 1e-5);

  // Without them, or with a name the cell lacks: an error naming what is missing.
  test::expectUserError(
      [&] {
        layer.forward(x.data(), {{"ctx", ctx.data()}}, 5, 3, nullptr, nullptr, nullptr, out.data(),
                      nullptr, nullptr);
      },
      {"side input 'score'", "none is given"});
  test::expectUserError(
      [&] {
        layer.forward(x.data(), {{"ctx", ctx.data()}, {"score", score.data()}, {"s", x.data()}}, 5,
                      3, nullptr, nullptr, nullptr, out.data(), nullptr, nullptr);
      },
      {"no side input 's'"});
}

TEST(SideInputs, ShapesAreCheckedNamingTheTensor) {
  Problem p = makeProblem(4, 2, 13);
  auto program = LayerProgram::build(*p.cell, p.weights, "weights", layerOptions(Engine::Jit));
  auto expectError = [&](std::map<std::string, Tensor> sides,
                         std::initializer_list<std::string> fragments) {
    test::expectUserError([&] { program->run(p.x, {}, {}, sides); }, fragments);
  };
  expectError({{"ctx", p.ctx}}, {"side input 'score'", "none is given"});
  expectError({{"ctx", p.ctx}, {"score", Tensor({3, 2, kHidden})}},
              {"side input 'score'", "[3, 2, 6]", "T = 4"});
  expectError({{"ctx", Tensor({4, 2, 4})}, {"score", p.score}},
              {"side input 'ctx'", "[4, 2, 4]", "context_size"});
  expectError({{"ctx", p.ctx}, {"score", p.score}, {"x", p.x}}, {"'x' is the first input"});
  expectError({{"ctx", p.ctx}, {"score", p.score}, {"y", p.x}}, {"no input of that name"});
}

class SideInputsTool : public test::ScratchDirTest {};

TEST_F(SideInputsTool, RunTakesEachInputByName) {
  Problem p = makeProblem(6, 3, 14);
  p.lengths.assign(3, 6);
  Expected expected = oracle(p);
  std::string cell = writeBytes("ctx_rnn.cell", kContextCell);
  writeSafeTensors(path("w.safetensors"), p.weights);
  writeNpy(path("x.npy"), p.x);
  writeNpy(path("ctx.npy"), p.ctx);
  writeNpy(path("score.npy"), p.score);
  test::ToolRunner tool(dir_);
  std::vector<std::string> args = {"run",
                                   "--cell",
                                   cell,
                                   "--weights",
                                   path("w.safetensors"),
                                   "--input",
                                   "x=" + path("x.npy"),
                                   "--input",
                                   "ctx=" + path("ctx.npy"),
                                   "--input",
                                   "score=" + path("score.npy"),
                                   "--size",
                                   "context_size=3",
                                   "--output",
                                   path("out.npy"),
                                   "--hn",
                                   path("hn.npy")};
  test::ToolResult r = tool.run(args);
  ASSERT_EQ(r.exitCode, 0) << r;
  EXPECT_LT(test::maxAbsDiff(readNpyFloat32(path("out.npy")), expected.output), 1e-5);
  EXPECT_LT(test::maxAbsDiff(readNpyFloat32(path("hn.npy")), expected.hn), 1e-5);

  // One left out, or a name the cell lacks: exit 1 with a message that says which.
  args.erase(args.begin() + 9, args.begin() + 11); // --input score=...
  r = tool.run(args);
  EXPECT_EQ(r.exitCode, 1) << r;
  EXPECT_THAT(r.err, testing::HasSubstr("side input 'score'")) << r;
  args.insert(args.end(), {"--input", "att=" + path("score.npy")});
  r = tool.run(args);
  EXPECT_EQ(r.exitCode, 1) << r;
  EXPECT_THAT(r.err, testing::HasSubstr("has the inputs x, ctx, score")) << r;
}

} // namespace
} // namespace rnnc

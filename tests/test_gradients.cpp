// Training (issue 14): the autodiff pass (IR in, IR out), gradients of whole layers against
// PyTorch autograd in float64 (tests/fixtures/grads, made by make_grad_fixtures.py) through the
// runtime on the JIT and the interpreter and through `rnnc grad`, and a custom cell with layer
// norm and every differentiable op against central finite differences.
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "ir/IRParser.h"
#include "ir/Printer.h"
#include "passes/Autodiff.h"
#include "rnnc/rnnc.h"
#include "runtime/data/Npy.h"
#include "runtime/exec/Hash.h"
#include "runtime/layers/Gradients.h"
#include "tests/DroppingCell.h"
#include "tests/RunnableCpus.h"
#include "tests/TestSupport.h"
#include "tests/ToolRunner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace rnnc {
namespace {

namespace fs = std::filesystem;

// ---- The pass: IR in, IR out ---------------------------------------------------------------

// tanh(x W^T + h U^T + b): the forward both forms of its backward are derived from.
constexpr const char* kElmanCell = R"(cell @rnn(input_size, hidden_size) {
  input %x : [B, input_size]
  state %h : [B, hidden_size]
  param %w : [hidden_size, input_size]
  param %u : [hidden_size, hidden_size]
  param %b : [hidden_size]
  step {
    %0 = linear %x, %w : [B, hidden_size]
    %1 = linear %h, %u : [B, hidden_size]
    %2 = add %0, %1 : [B, hidden_size]
    %3 = add %2, %b : [B, hidden_size]
    %4 = tanh %3 : [B, hidden_size]
  }
  yield %h = %4
  output %4
})";

TEST(Autodiff, ElmanCellBackwardStep) {
  auto forward = ir::parseIR(kElmanCell);
  passes::BackwardCell backward = passes::deriveBackward(*forward);
  // dy flows in from the output and from the next step (grad.h); tanh' = 1 - y^2 with y the
  // value the forward kept (no product of the forward runs again); then dh = g U in the loop,
  // and g once in the output: the factor of U, W, b and of dx = g W (their operands x and h are
  // the backward's own inputs).
  EXPECT_EQ(ir::toString(*backward.cell), R"(cell @rnn_backward(input_size, hidden_size) {
  input %x : [B, input_size]
  input %h : [B, hidden_size]
  input %grad.output : [B, hidden_size]
  input %kept.0 : [B, hidden_size]
  state %grad.h : [B, hidden_size]
  param %w : [hidden_size, input_size]
  param %u : [hidden_size, hidden_size]
  param %b : [hidden_size]
  step {
    %0 = add %grad.output, %grad.h : [B, hidden_size]
    %1 = mul %kept.0, %kept.0 : [B, hidden_size]
    %2 = const {value = 1} : []
    %3 = sub %2, %1 : [B, hidden_size]
    %4 = mul %0, %3 : [B, hidden_size]
    %5 = matmul %4, %u : [B, hidden_size]
  }
  yield %grad.h = %5
  output %4
}
)");
  EXPECT_EQ(backward.kept, std::vector<size_t>{4}); // %4 = tanh
  // The training forward outputs y alone: h leaves the step as y and the kept value is y (the
  // h entering a step is the one the step before left, read there by the runner). So it is the
  // forward itself, under its own name.
  passes::TrainingForward training = passes::trainingForward(*forward, backward);
  std::string renamed = kElmanCell;
  renamed.replace(renamed.find("@rnn("), 5, "@rnn_training(");
  EXPECT_EQ(ir::toString(*training.cell), renamed + "\n");
  EXPECT_EQ(training.width.str(), "hidden_size");
  ASSERT_EQ(training.stateOffsets.size(), 1u);
  EXPECT_EQ(training.stateOffsets[0].str(), "0");
  ASSERT_EQ(training.keptOffsets.size(), 1u);
  EXPECT_EQ(training.keptOffsets[0].str(), "0");
  using Kind = passes::GradientSegment::Kind;
  ASSERT_EQ(backward.segments.size(), 4u);
  // dx = g w for all steps at once, by the runner after the loop.
  EXPECT_EQ(backward.segments[0].kind, Kind::InputByLinear);
  EXPECT_EQ(backward.segments[0].name, "x");
  EXPECT_EQ(backward.segments[0].weight, "w");
  EXPECT_EQ(backward.segments[1].kind, Kind::LinearWeight);
  EXPECT_EQ(backward.segments[1].name, "u");
  EXPECT_EQ(backward.segments[1].operandInput, "h");
  EXPECT_EQ(backward.segments[2].name, "w");
  EXPECT_EQ(backward.segments[2].operandInput, "x");
  for (const auto& segment : backward.segments)
    EXPECT_EQ(segment.offset.str(), "0"); // g, once
  EXPECT_EQ(backward.segments[3].kind, Kind::VectorWeight);
  EXPECT_EQ(backward.segments[3].name, "b");
}

// With ForwardValues::Recompute the forward keeps only the states entering each step, and the
// backward step runs the forward step again before its gradients.
TEST(Autodiff, RecomputeRunsTheForwardStepAgain) {
  auto forward = ir::parseIR(kElmanCell);
  passes::BackwardCell backward =
      passes::deriveBackward(*forward, passes::ForwardValues::Recompute);
  EXPECT_TRUE(backward.kept.empty());
  EXPECT_EQ(ir::toString(*backward.cell), R"(cell @rnn_backward(input_size, hidden_size) {
  input %x : [B, input_size]
  input %h : [B, hidden_size]
  input %grad.output : [B, hidden_size]
  state %grad.h : [B, hidden_size]
  param %w : [hidden_size, input_size]
  param %u : [hidden_size, hidden_size]
  param %b : [hidden_size]
  step {
    %0 = linear %x, %w : [B, hidden_size]
    %1 = linear %h, %u : [B, hidden_size]
    %2 = add %0, %1 : [B, hidden_size]
    %3 = add %2, %b : [B, hidden_size]
    %4 = tanh %3 : [B, hidden_size]
    %5 = add %grad.output, %grad.h : [B, hidden_size]
    %6 = mul %4, %4 : [B, hidden_size]
    %7 = const {value = 1} : []
    %8 = sub %7, %6 : [B, hidden_size]
    %9 = mul %5, %8 : [B, hidden_size]
    %10 = matmul %9, %u : [B, hidden_size]
  }
  yield %grad.h = %10
  output %9
}
)");
}

// In training a dropout's mask is a value the forward keeps (as it keeps a product): the
// backward multiplies by it and never draws one, whether it keeps values or recomputes them.
TEST(Autodiff, DropoutMasksAreKeptNeverDrawnAgain) {
  auto forward = ir::parseIR(R"(cell @d(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %u : [n, n]
  step {
    %0 = dropout_mask %h {p = 0.5, stream = 0} : [B, n]
    %1 = mul %h, %0 : [B, n]
    %2 = linear %1, %u : [B, n]
    %3 = add %2, %x : [B, n]
    %4 = tanh %3 : [B, n]
  }
  yield %h = %4
  output %4
}
)");
  for (auto policy : {passes::ForwardValues::Keep, passes::ForwardValues::Recompute}) {
    passes::BackwardCell backward = passes::deriveBackward(*forward, policy);
    EXPECT_FALSE(ir::containsOp(*backward.cell, ir::Op::DropoutMask))
        << ir::toString(*backward.cell);
    ASSERT_FALSE(backward.kept.empty());
    EXPECT_EQ(backward.kept[0], 0u) << "the mask, %0, is the first value kept";
    if (policy == passes::ForwardValues::Recompute) {
      EXPECT_EQ(backward.kept.size(), 1u) << "only the mask";
    }
  }
}

// An LSTM keeps its four activated gates (cuDNN's reserve space: the gates and c; h and c enter
// the backward as states) and its backward step has one product: dh = dgates W_hh.
TEST(Autodiff, LstmKeepsItsGatesAndRunsNoForwardProduct) {
  auto forward = frontend::loadCell("lstm");
  passes::BackwardCell backward = passes::deriveBackward(*forward);
  ASSERT_EQ(backward.kept.size(), 4u);
  const auto& inputs = backward.cell->inputs;
  for (size_t k = inputs.size() - 4; k < inputs.size(); ++k)
    EXPECT_EQ(ir::shapeStr(inputs[k]->shape), "[B, hidden_size]");
  int products = 0;
  for (const auto& instr : backward.cell->step)
    if (instr->op == ir::Op::Linear || instr->op == ir::Op::MatMul)
      ++products;
  EXPECT_EQ(products, 1) << ir::toString(*backward.cell);
  // Each kept value is a gate's activation in the forward.
  std::vector<const ir::Instr*> forwardInstrs;
  for (const auto& instr : forward->step)
    forwardInstrs.push_back(instr.get());
  for (size_t position : backward.kept) {
    ir::Op op = forwardInstrs.at(position)->op;
    EXPECT_TRUE(op == ir::Op::Sigmoid || op == ir::Op::Tanh) << ir::opName(op);
  }
  // The training forward writes h (its output, which h leaves the step as), c and the four
  // gates: with y, cuDNN's reserve space (the gates and c).
  passes::TrainingForward training = passes::trainingForward(*forward, backward);
  EXPECT_EQ(training.width.str(), "6*hidden_size");
  std::vector<std::string> states, kept;
  for (const ir::Dim& d : training.stateOffsets)
    states.push_back(d.str());
  for (const ir::Dim& d : training.keptOffsets)
    kept.push_back(d.str());
  EXPECT_EQ(states, (std::vector<std::string>{"0", "hidden_size"}));
  EXPECT_EQ(kept, (std::vector<std::string>{"2*hidden_size", "3*hidden_size", "4*hidden_size",
                                            "5*hidden_size"}));
}

// The gradient of a chunked value is its chunks' gradients side by side, zeros for a chunk
// nothing reads; a layer norm's is layernorm_grad.
TEST(Autodiff, ChunksAndLayerNorm) {
  auto forward = frontend::parseCell(R"(cell c(n) {
  input x[n]
  state h[n]
  param w[3*n, n]
  a, b, unused = chunk(linear(x, w), 3)
  h2 = layernorm(a * h) + b
  return h = h2; output h2
})",
                                     "c.cell");
  std::string text =
      ir::toString(*passes::deriveBackward(*forward, passes::ForwardValues::Recompute).cell);
  EXPECT_NE(text.find("layernorm_grad"), std::string::npos) << text;
  // The third chunk's gradient is a zero block: a slice of the product times 0.
  EXPECT_NE(text.find("slice %0 {offset = 2*n} : [B, n]"), std::string::npos) << text;
  EXPECT_NE(text.find(" : [B, 3*n]"), std::string::npos) << text;
}

// ---- Whole layers against PyTorch autograd ---------------------------------------------------

const fs::path kGradFixtures = fs::path(RNNC_SOURCE_DIR) / "tests" / "fixtures" / "grads";

std::vector<std::string> gradCases() {
  std::vector<std::string> cases;
  for (const auto& entry : fs::directory_iterator(kGradFixtures))
    if (entry.is_directory())
      cases.push_back(entry.path().filename().string());
  std::sort(cases.begin(), cases.end());
  return cases;
}

std::string fixture(const std::string& name, const std::string& file) {
  return (kGradFixtures / name / file).string();
}

// Every expected gradient is there and within 1e-4 of PyTorch's, relative to its largest value.
void expectGradientsMatch(const TensorMap& actual, const TensorMap& expected) {
  for (const auto& [name, want] : expected) {
    SCOPED_TRACE(name);
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << "no gradient for " << name;
    ASSERT_EQ(it->second.shape(), want.shape());
    float scale = 1e-6f;
    for (float v : want.values())
      scale = std::max(scale, std::abs(v));
    EXPECT_LE(test::maxAbsDiff(it->second, want) / scale, 1e-4f);
  }
  for (const auto& [name, tensor] : actual)
    EXPECT_TRUE(expected.count(name)) << "a gradient PyTorch has not: " << name;
}

class PyTorchGradients : public testing::TestWithParam<std::string> {};

TEST_P(PyTorchGradients, MatchAutogradInFloat64) {
  const std::string name = GetParam();
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(fixture(name, "meta.json")));
  TensorMap weights = readSafeTensors(fixture(name, "weights.safetensors"));
  TensorMap expected = readSafeTensors(fixture(name, "grads.safetensors"));
  std::string cellName = meta["cell"].get<std::string>();
  if (meta["proj_size"].get<int>() > 0)
    cellName = "lstm_proj";
  auto cell = frontend::loadCell(cellName);
  GradientRequest request;
  request.weights = &weights;
  request.input = readNpyFloat32(fixture(name, "input.npy"));
  request.initialStates["h"] = readNpyFloat32(fixture(name, "h0.npy"));
  request.gradOutput = readNpyFloat32(fixture(name, "grad_output.npy"));
  request.gradFinalStates["h"] = readNpyFloat32(fixture(name, "grad_hn.npy"));
  if (fs::exists(fixture(name, "c0.npy"))) {
    request.initialStates["c"] = readNpyFloat32(fixture(name, "c0.npy"));
    request.gradFinalStates["c"] = readNpyFloat32(fixture(name, "grad_cn.npy"));
  }
  if (fs::exists(fixture(name, "lengths.npy")))
    request.lengths = readNpyInt64(fixture(name, "lengths.npy"));
  for (Engine engine : {Engine::Jit, Engine::Interpreter})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(engine == Engine::Jit ? "jit, " : "interpreter, ") +
                   std::to_string(threads) + " threads");
      LayerOptions options;
      options.engine = engine;
      options.threads = threads;
      options.batchFirst = meta["batch_first"].get<bool>();
      expectGradientsMatch(runGradients(*cell, request, options).gradients, expected);
    }
  // AVX2 code throughout (as every host of ours runs), the weight gradients' GEMMs included
  // (runtime/exec/Gemm.h), on a host with AVX-512 too.
  SCOPED_TRACE("jit for haswell, 2 threads");
  LayerOptions options;
  options.threads = 2;
  options.batchFirst = meta["batch_first"].get<bool>();
  options.compile.targetCpu = "haswell";
  expectGradientsMatch(runGradients(*cell, request, options).gradients, expected);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PyTorchGradients, testing::ValuesIn(gradCases()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// `rnnc grad` of a gradient fixture: its cell, weights, input, initial states, lengths and
// output gradients, writing the gradients to `grads`.
std::vector<std::string> gradToolArgs(const std::string& name, const std::string& grads) {
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(fixture(name, "meta.json")));
  std::vector<std::string> args = {"grad",
                                   "--cell",
                                   meta["cell"].get<std::string>(),
                                   "--weights",
                                   fixture(name, "weights.safetensors"),
                                   "--input",
                                   fixture(name, "input.npy"),
                                   "--h0",
                                   fixture(name, "h0.npy"),
                                   "--grad-output",
                                   fixture(name, "grad_output.npy"),
                                   "--grad-hn",
                                   fixture(name, "grad_hn.npy"),
                                   "--grads",
                                   grads};
  if (fs::exists(fixture(name, "c0.npy")))
    args.insert(args.end(),
                {"--c0", fixture(name, "c0.npy"), "--grad-cn", fixture(name, "grad_cn.npy")});
  if (fs::exists(fixture(name, "lengths.npy")))
    args.insert(args.end(), {"--lengths", fixture(name, "lengths.npy")});
  if (meta["batch_first"].get<bool>())
    args.push_back("--batch-first");
  return args;
}

// `rnnc grad` writes the same gradients, under the contract's names, into a safetensors file.
class GradTool : public test::ScratchDirTest {};

TEST_F(GradTool, WritesEveryGradientAsPyTorchNamesIt) {
  for (const std::string name : {"lstm_l2_bi_len", "gru_l2_bi_bf_len", "lstm_proj_l2_bi"}) {
    SCOPED_TRACE(name);
    std::vector<std::string> args = gradToolArgs(name, path("g.safetensors"));
    test::ToolResult r = test::ToolRunner(dir_).run(args);
    ASSERT_EQ(r.exitCode, 0) << r;
    expectGradientsMatch(readSafeTensors(path("g.safetensors")),
                         readSafeTensors(fixture(name, "grads.safetensors")));
  }
}

// `rnnc grad --weights-dtype fp16|bf16`: mixed-precision gradients, those the interpreter gives
// computing its products alike (--interpret), near PyTorch's fp32 ones but not equal to them.
TEST_F(GradTool, MixedPrecisionGradientsAreTheInterpretersAndNearFp32) {
  const std::string name = "lstm_l2_bi_len";
  const TensorMap fp32 = readSafeTensors(fixture(name, "grads.safetensors"));
  for (const std::string dtype : {"fp16", "bf16"}) {
    SCOPED_TRACE(dtype);
    std::vector<std::string> args = gradToolArgs(name, path("jit.safetensors"));
    args.insert(args.end(), {"--weights-dtype", dtype});
    test::ToolResult r = test::ToolRunner(dir_).run(args);
    ASSERT_EQ(r.exitCode, 0) << r;
    args = gradToolArgs(name, path("interpreted.safetensors"));
    args.insert(args.end(), {"--weights-dtype", dtype, "--interpret"});
    r = test::ToolRunner(dir_).run(args);
    ASSERT_EQ(r.exitCode, 0) << r;
    const TensorMap jit = readSafeTensors(path("jit.safetensors"));
    const TensorMap interpreted = readSafeTensors(path("interpreted.safetensors"));
    ASSERT_EQ(jit.size(), fp32.size());
    double worstAgainstFp32 = 0;
    for (const auto& [gradient, want] : fp32) {
      float scale = 1e-6f;
      for (float v : want.values())
        scale = std::max(scale, std::fabs(v));
      EXPECT_LT(test::maxAbsDiff(jit.at(gradient), interpreted.at(gradient)) / scale,
                dtype == "fp16" ? 1e-4f : 2e-3f)
          << gradient;
      worstAgainstFp32 =
          std::max<double>(worstAgainstFp32, test::maxAbsDiff(jit.at(gradient), want) / scale);
    }
    EXPECT_LT(worstAgainstFp32, 5e-2);
    EXPECT_GT(worstAgainstFp32, dtype == "fp16" ? 1e-5 : 1e-4) << "the weights were not reduced";
  }
}

// The backward's recurrent product (dgates W_hh) divided unevenly between two threads
// (RNNC_THREAD_SHARES; runtime/threads/WorkBalance.h moves the blocks at every barrier) gives
// PyTorch's gradients.
TEST_F(GradTool, UnevenThreadSharesGiveTheSameGradients) {
  for (const std::string name : {"lstm_l2_bi_len", "gru_l1_uni"}) {
    std::vector<std::string> args = gradToolArgs(name, path("g.safetensors"));
    args.insert(args.end(), {"--threads", "2"});
    for (const std::string shares : {"0.3,0.7", "0.7,0.3"}) {
      SCOPED_TRACE(name + " with shares " + shares);
      test::ToolResult r =
          test::ToolRunner(dir_).run(args, "export RNNC_THREAD_SHARES=" + shares + "; ");
      ASSERT_EQ(r.exitCode, 0) << r;
      expectGradientsMatch(readSafeTensors(path("g.safetensors")),
                           readSafeTensors(fixture(name, "grads.safetensors")));
    }
  }
}

TEST_F(GradTool, AbsentGradientsAreZerosAndBadShapesAreErrors) {
  const std::string name = "gru_l1_uni";
  std::vector<std::string> args = {"grad",
                                   "--cell",
                                   "gru",
                                   "--weights",
                                   fixture(name, "weights.safetensors"),
                                   "--input",
                                   fixture(name, "input.npy"),
                                   "--grads",
                                   path("g.safetensors")};
  test::ToolRunner tool(dir_);
  test::ToolResult r = tool.run(args);
  ASSERT_EQ(r.exitCode, 0) << r;
  for (const auto& [key, grad] : readSafeTensors(path("g.safetensors")))
    for (float v : grad.values())
      ASSERT_EQ(v, 0.0f) << key; // loss = 0: every gradient is zero
  args.insert(args.end(), {"--grad-hn", fixture(name, "input.npy")});
  r = tool.run(args);
  EXPECT_EQ(r.exitCode, 1) << r;
  EXPECT_NE(
      r.err.find("the gradient of final state 'h' (" + fixture(name, "input.npy") + ") has shape"),
      std::string::npos)
      << r;
}

// ---- A custom cell against central finite differences -----------------------------------------

// Layer norm, chunks read raw, every differentiable op, a parameter vector read elementwise,
// and `x @ W` (matmul) beside linear().
const char* kCustomCell = R"(cell custom(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size], c[hidden_size]
  param w[3*hidden_size, input_size], u[hidden_size, 3*hidden_size], v[hidden_size]
  param ln.weight[hidden_size]
  a, b, g = chunk(linear(x, w) + h @ u, 3)
  n = layernorm(a * sigmoid(b), ln.weight, eps=0.001)
  q = min(n, clamp(g, -0.5, 0.8)) / (2 + tanh(v * c)) - max(relu(b), exp(tanh(g)) * 0.1)
  c2 = sigmoid(g) * c + sqrt(sigmoid(a)) * tanh(q) + log(1 + sigmoid(b)) * 0.1
  h2 = tanh(c2) * -sigmoid(n)
  return h = h2, c = c2; output h2
})";

// Every gradient runGradients gives for `request` (JIT) against central differences of the loss
// on the interpreter, for a few entries of every parameter, input, side input and initial state.
// Two step sizes that disagree mean a kink (min, max, clamp, relu) lies within the step: such
// an entry is skipped, and few may be.
void expectCentralDifferences(const ir::Cell& cell, GradientRequest& request,
                              LayerOptions options) {
  TensorMap& weights = const_cast<TensorMap&>(*request.weights);
  options.engine = Engine::Jit;
  GradientResult result = runGradients(cell, request, options);
  auto loss = [&] {
    LayerOptions interpret = options;
    interpret.engine = Engine::Interpreter;
    LayerRequest layer;
    layer.weights = request.weights;
    layer.input = request.input;
    layer.sideInputs = request.sideInputs;
    layer.initialStates = request.initialStates;
    layer.lengths = request.lengths;
    LayerResult out = runLayers(cell, layer, interpret);
    double sum = 0; // in double where it sums
    for (int64_t i = 0; i < out.output.numel(); ++i)
      sum += double(out.output.data()[i]) * request.gradOutput.data()[i];
    for (const auto& [name, grad] : request.gradFinalStates)
      for (int64_t i = 0; i < grad.numel(); ++i)
        sum += double(out.finalStates.at(name).data()[i]) * grad.data()[i];
    return sum;
  };
  int checked = 0, kinks = 0;
  auto check = [&](const std::string& name, Tensor& t) {
    SCOPED_TRACE(name);
    const Tensor& analytic = result.gradients.at(name);
    auto centralDifference = [&](int64_t i, float step) {
      const float saved = t.data()[i];
      t.data()[i] = saved + step;
      double up = loss();
      t.data()[i] = saved - step;
      double down = loss();
      t.data()[i] = saved;
      return (up - down) / (2.0 * step);
    };
    for (int64_t i = 0; i < t.numel(); i += std::max<int64_t>(1, t.numel() / 5)) {
      double coarse = centralDifference(i, 1e-2f), fine = centralDifference(i, 3e-3f);
      double tolerance = 2e-3 * std::max(1.0, std::abs(fine));
      if (std::abs(coarse - fine) > tolerance) {
        ++kinks;
        continue;
      }
      ++checked;
      EXPECT_NEAR(analytic.data()[i], fine, tolerance) << "entry " << i;
    }
  };
  for (auto& [name, t] : weights)
    check(name, t);
  check("input", request.input);
  for (auto& [name, t] : request.sideInputs)
    check(name, t);
  for (auto& [name, t] : request.initialStates)
    check(initialStateGradientName(name), t);
  EXPECT_GE(checked, 8 * kinks) << checked << " entries checked, " << kinks << " at kinks";
}

TEST(Gradients, CustomCellMatchesCentralDifferences) {
  auto cell = frontend::parseCell(kCustomCell, "custom.cell");
  std::mt19937 rng(5);
  const int64_t steps = 4, batch = 3, input = 3, hidden = 4;
  TensorMap weights =
      test::randomWeights(*cell, {{"input_size", input}, {"hidden_size", hidden}}, rng);
  for (auto& [name, t] : weights)
    for (float& v : t.values())
      v *= 2; // away from the linear regime
  GradientRequest request;
  request.weights = &weights;
  request.input = test::randomTensor({steps, batch, input}, rng, 1.0f);
  request.initialStates["h"] = test::randomTensor({1, batch, hidden}, rng, 0.5f);
  request.initialStates["c"] = test::randomTensor({1, batch, hidden}, rng, 0.5f);
  request.gradOutput = test::randomTensor({steps, batch, hidden}, rng, 1.0f);
  request.gradFinalStates["c"] = test::randomTensor({1, batch, hidden}, rng, 1.0f);
  request.lengths = Int64Array{{batch}, {4, 1, 3}};
  expectCentralDifferences(*cell, request, {});
}

// Gradients are the same bits on any thread count, as the forward's outputs are (JitThreads in
// test_jit.cpp): an automatic run's count follows the machine's load, and a training run must
// not give another answer for it. Each thread computes whole elements of every result, summed in
// the order one thread sums them: the backward step's column blocks, and the weight and input
// gradients' rows of C over the whole depth (T*B = 1536 here, three depth blocks and eight times
// 4H: a split of the depth between threads, partial sums added at the end, changed the bits of
// dW). Both directions, variable lengths, AVX2's code and the host's, and mixed precision in
// bf16 on the host (its GEMM on bf16 pairs where the host has AVX512_BF16).
TEST(Gradients, AreTheSameBitsOnAnyThreadCount) {
  const int64_t steps = 24, batch = 64, input = 24, hidden = 48;
  std::vector<std::pair<std::string, codegen::WeightType>> runs;
  for (const std::string& cpu : test::runnableCpus())
    runs.emplace_back(cpu, codegen::WeightType::F32);
  runs.emplace_back("", codegen::WeightType::BF16);
  for (const auto& [cpu, weightType] : runs)
    for (const char* name : {"lstm", "gru", "rnn_tanh"}) {
      auto cell = frontend::loadCell(name);
      std::mt19937 rng(17);
      TensorMap weights;
      for (const char* suffix : {"_l0", "_l0_reverse"})
        for (auto& [param, tensor] :
             test::randomWeights(*cell, {{"input_size", input}, {"hidden_size", hidden}}, rng))
          weights[param + suffix] = std::move(tensor);
      GradientRequest request;
      request.weights = &weights;
      request.input = test::randomTensor({steps, batch, input}, rng, 1.0f);
      request.gradOutput = test::randomTensor({steps, batch, 2 * hidden}, rng, 1.0f);
      std::vector<int64_t> lengths(static_cast<size_t>(batch));
      for (int64_t b = 0; b < batch; ++b)
        lengths[static_cast<size_t>(b)] = steps - b % 5;
      request.lengths = Int64Array{{batch}, lengths};
      LayerOptions options;
      options.bidirectional = true;
      options.compile.targetCpu = cpu;
      options.compile.weights = weightType;
      options.threads = 1;
      const TensorMap one = runGradients(*cell, request, options).gradients;
      for (int threads : {2, 3}) {
        options.threads = threads;
        const TensorMap many = runGradients(*cell, request, options).gradients;
        ASSERT_EQ(many.size(), one.size());
        for (const auto& [gradient, tensor] : one) {
          const Tensor& other = many.at(gradient);
          ASSERT_EQ(other.shape(), tensor.shape()) << gradient;
          // Bits, not values: -0 and +0, or two NaNs, would compare equal as floats.
          EXPECT_EQ(std::memcmp(other.data(), tensor.data(),
                                static_cast<size_t>(tensor.numel()) * sizeof(float)),
                    0)
              << name << " for '" << cpu << "' on " << threads << " threads: " << gradient;
        }
      }
    }
}

// The tape keeps the layer's input for the backward: an input moved in is kept as it is (a copy
// of the default LSTM's 13 MB input was ~1% of a training step), one lent is copied, so that the
// caller may change it before the backward; both give the same gradients.
TEST(Gradients, TheTapeKeepsAMovedInputAndCopiesALentOne) {
  auto cell = frontend::loadCell("rnn_tanh");
  std::mt19937 rng(5);
  TensorMap weights;
  for (auto& [name, tensor] :
       test::randomWeights(*cell, {{"input_size", 3}, {"hidden_size", 4}}, rng))
    weights[name + "_l0"] = std::move(tensor);
  LayerOptions options;
  options.threads = 1;
  auto program = GradientProgram::build(*cell, weights, "random weights", options);
  const Tensor input = test::randomTensor({5, 2, 3}, rng, 1.0f);
  GradientInputs grads;
  grads.output = test::randomTensor({5, 2, 4}, rng, 1.0f);

  Tensor lent = input;
  TrainingTape lentTape = program->forward(lent, {}, std::nullopt);
  EXPECT_NE(lentTape.slots.at(0).inputs.at(0)->data(), lent.data());
  lent.data()[0] += 1.0f; // the caller's to change: the tape's copy stays
  const TensorMap fromLent = program->backward(lentTape, grads);

  Tensor moved = input;
  const float* movedData = moved.data();
  TrainingTape movedTape = program->forward(std::move(moved), {}, std::nullopt);
  EXPECT_EQ(movedTape.slots.at(0).inputs.at(0)->data(), movedData);
  const TensorMap fromMoved = program->backward(movedTape, grads);

  ASSERT_EQ(fromLent.size(), fromMoved.size());
  for (const auto& [name, gradient] : fromLent)
    EXPECT_EQ(gradient.values(), fromMoved.at(name).values()) << name;
}

// A cell none of whose inputs and parameters reach the loss (whatever reads them is dead) still
// trains: zero gradients of their shapes, and the state's through the steps. The differential
// fuzzer found it (tests/fuzz/cells --backward): the backward step had no output at all, and the
// input's gradient no shape.
TEST(Gradients, InputsAndParametersThatReachNothingGetZeroGradients) {
  auto cell = frontend::parseCell(R"(cell dead(input_size, hidden_size) {
  input x[input_size], y[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], b[hidden_size]
  g = linear(x, w, b)
  u = tanh(y)
  h2 = tanh(h) * sigmoid(h)
  return h = h2; output h2
})",
                                  "dead.cell");
  std::mt19937 rng(17);
  const int64_t steps = 3, batch = 2, input = 5, hidden = 4;
  TensorMap weights =
      test::randomWeights(*cell, {{"input_size", input}, {"hidden_size", hidden}}, rng);
  GradientRequest request;
  request.weights = &weights;
  request.input = test::randomTensor({steps, batch, input}, rng, 1.0f);
  request.sideInputs["y"] = test::randomTensor({steps, batch, input}, rng, 1.0f);
  request.initialStates["h"] = test::randomTensor({1, batch, hidden}, rng, 1.0f);
  request.gradOutput = test::randomTensor({steps, batch, hidden}, rng, 1.0f);
  for (Engine engine : {Engine::Jit, Engine::Interpreter}) {
    LayerOptions options;
    options.engine = engine;
    const TensorMap grads = runGradients(*cell, request, options).gradients;
    for (const auto& [name, shape] :
         std::map<std::string, TensorShape>{{"input", {steps, batch, input}},
                                            {"y", {steps, batch, input}},
                                            {"w", {hidden, input}},
                                            {"b", {hidden}}}) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(grads.count(name));
      EXPECT_EQ(grads.at(name).shape(), shape);
      EXPECT_EQ(test::maxAbsDiff(grads.at(name), Tensor(shape)), 0.0f);
    }
  }
  expectCentralDifferences(*cell, request, {});
}

// A request for one layer of a cell with sizes input_size and hidden_size and one state h:
// random weights (into `weights`), input, initial h and gradients of the output and final h.
GradientRequest oneLayerRequest(const ir::Cell& cell, TensorMap& weights, unsigned seed,
                                int64_t steps, int64_t batch, int64_t input, int64_t hidden) {
  std::mt19937 rng(seed);
  weights = test::randomWeights(cell, {{"input_size", input}, {"hidden_size", hidden}}, rng);
  GradientRequest request;
  request.weights = &weights;
  request.input = test::randomTensor({steps, batch, input}, rng, 1.0f);
  request.initialStates["h"] = test::randomTensor({1, batch, hidden}, rng, 1.0f);
  request.gradOutput = test::randomTensor({steps, batch, hidden}, rng, 1.0f);
  request.gradFinalStates["h"] = test::randomTensor({1, batch, hidden}, rng, 1.0f);
  return request;
}

// A layer norm of parameters alone (no batch dimension) that every row reads with its own
// gradient: the rows' gradients go back through the same norm and add up in the parameter's.
// The differential fuzzer found it: layernorm_grad refused the rows' gradient as wider than its
// operand.
TEST(Gradients, ALayerNormOfParametersAloneMatchesCentralDifferences) {
  auto cell = frontend::parseCell(R"(cell lnparams(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], v[hidden_size], s[hidden_size]
  n = layernorm(tanh(v), s, eps=0.001)
  h2 = tanh(linear(x, w) + n * h + 0.5 * n)
  return h = h2; output h2
})",
                                  "lnparams.cell");
  TensorMap weights;
  GradientRequest request = oneLayerRequest(*cell, weights, 19, 3, 3, 3, 5);
  for (float& v : weights.at("v").values())
    v *= 4; // a spread for the norm to act on
  expectCentralDifferences(*cell, request, {});
}

// Weights made of parameters alone: a product's weight scaled, summed, squashed, and a row
// broadcast over it (x's side, whose input gradient the runner forms with the weight's value,
// and h's, which the backward step reads), one of them read by two products. Their gradients
// go on through what made them to the parameters; the JIT's against central differences of the
// interpreter's loss, and the interpreter's gradients against the JIT's.
TEST(Gradients, WeightsMadeOfParametersMatchCentralDifferences) {
  auto cell = frontend::parseCell(R"(cell derived(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w_ih[hidden_size, input_size], s[input_size], w_hh[hidden_size, hidden_size]
  param v_hh[hidden_size, hidden_size], b[hidden_size]
  u = 0.5 * w_hh + tanh(v_hh)
  h2 = tanh(linear(x, w_ih * s, b) + linear(h, u) + 0.1 * linear(h, u - v_hh / 2))
  return h = h2; output h2
})",
                                  "derived.cell");
  TensorMap weights;
  GradientRequest request = oneLayerRequest(*cell, weights, 23, 3, 2, 4, 5);
  expectCentralDifferences(*cell, request, {});

  LayerOptions jit, interpret;
  jit.engine = Engine::Jit;
  interpret.engine = Engine::Interpreter;
  const GradientResult a = runGradients(*cell, request, jit);
  const GradientResult b = runGradients(*cell, request, interpret);
  for (const char* name : {"w_ih", "s", "w_hh", "v_hh", "b", "input"}) {
    SCOPED_TRACE(name);
    const Tensor& x = a.gradients.at(name);
    const Tensor& y = b.gradients.at(name);
    ASSERT_EQ(x.shape(), y.shape());
    for (int64_t i = 0; i < x.numel(); ++i)
      EXPECT_NEAR(x.data()[i], y.data()[i], 1e-4 * (1 + std::abs(y.data()[i])));
  }
}

// A weight made of parameters through an operation training does not differentiate on whole
// matrices is refused, naming the operation.
TEST(Gradients, AWeightMadeThroughALayerNormIsAClearError) {
  auto cell = frontend::parseCell(R"(cell normed(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w_ih[hidden_size, input_size], w_hh[hidden_size, hidden_size], s[hidden_size]
  h2 = tanh(linear(x, w_ih) + linear(h, layernorm(w_hh, s, s)))
  return h = h2; output h2
})",
                                  "normed.cell");
  try {
    passes::deriveBackward(*cell);
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), testing::HasSubstr("'layernorm'"));
  }
}

// A cell whose output is none of its states: the training forward then keeps each state's next
// value in columns of its own, and the backward reads the states entering each step there (the
// step before's, the initial state at each sequence's first step). Both directions, so that
// the reverse one starts each sequence from its own last step.
TEST(Gradients, ACellWhoseOutputIsNoStateMatchesCentralDifferences) {
  auto cell = frontend::parseCell(R"(cell apart(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size], c[hidden_size]
  param w[2*hidden_size, input_size], u[2*hidden_size, hidden_size]
  a, b = chunk(linear(x, w) + linear(h, u), 2)
  c2 = sigmoid(b) * c + tanh(a)
  h2 = tanh(c2) * sigmoid(a)
  return h = h2, c = c2; output h2 * c2 + 0.5 * c
})",
                                  "apart.cell");
  std::mt19937 rng(13);
  const int64_t steps = 4, batch = 3, input = 3, hidden = 4;
  TensorMap weights;
  for (const char* suffix : {"_l0", "_l0_reverse"}) {
    weights[std::string("w") + suffix] = test::randomTensor({2 * hidden, input}, rng, 0.8f);
    weights[std::string("u") + suffix] = test::randomTensor({2 * hidden, hidden}, rng, 0.8f);
  }
  GradientRequest request;
  request.weights = &weights;
  request.input = test::randomTensor({steps, batch, input}, rng, 1.0f);
  request.initialStates["h"] = test::randomTensor({2, batch, hidden}, rng, 0.5f);
  request.initialStates["c"] = test::randomTensor({2, batch, hidden}, rng, 0.5f);
  request.gradOutput = test::randomTensor({steps, batch, 2 * hidden}, rng, 1.0f);
  request.gradFinalStates["h"] = test::randomTensor({2, batch, hidden}, rng, 1.0f);
  request.gradFinalStates["c"] = test::randomTensor({2, batch, hidden}, rng, 1.0f);
  request.lengths = Int64Array{{batch}, {4, 1, 3}};
  expectCentralDifferences(*cell, request, {});
}

// A request for one bidirectional layer of a cell with parameters w [hidden, input],
// u [hidden, hidden] and b [hidden] (filled into `weights`), random inputs, initial states and
// gradients, from `seed`.
GradientRequest bidirectionalRequest(TensorMap& weights, unsigned seed, int64_t steps,
                                     int64_t batch, int64_t input, int64_t hidden) {
  std::mt19937 rng(seed);
  for (const char* suffix : {"_l0", "_l0_reverse"}) {
    weights[std::string("w") + suffix] = test::randomTensor({hidden, input}, rng, 0.8f);
    weights[std::string("u") + suffix] = test::randomTensor({hidden, hidden}, rng, 0.8f);
    weights[std::string("b") + suffix] = test::randomTensor({hidden}, rng, 0.3f);
  }
  GradientRequest request;
  request.weights = &weights;
  request.input = test::randomTensor({steps, batch, input}, rng, 1.0f);
  request.initialStates["h"] = test::randomTensor({2, batch, hidden}, rng, 0.5f);
  request.gradOutput = test::randomTensor({steps, batch, 2 * hidden}, rng, 1.0f);
  request.gradFinalStates["h"] = test::randomTensor({2, batch, hidden}, rng, 1.0f);
  return request;
}

// Dropout inside a cell in training (passes/TrainingDropout.h): the backward multiplies the
// gradient by the masks the forward drew, so the gradients are those of the function the masks
// fixed, which central differences of the training forward measure (the interpreter drawing the
// same masks from the seed). Dropout of the input, of the state and of the output
// (tests/DroppingCell.h); both directions, lengths.
TEST(Gradients, DropoutInsideACellMatchesCentralDifferencesWithTheForwardsMasks) {
  auto cell = frontend::parseCell(test::kDroppingCell, "dropping.cell");
  TensorMap weights;
  GradientRequest request = bidirectionalRequest(weights, 17, 5, 3, 3, 4);
  request.lengths = Int64Array{{3}, {5, 2, 4}};
  LayerOptions options;
  options.bidirectional = true;
  options.training = true;
  options.seed = 9;
  expectCentralDifferences(*cell, request, options);
}

// A recurrent weight's dropout (AWD-LSTM's weight drop) trains: the product's weight is the
// weight times the run's mask, whose gradient goes back through the mask (zero where it dropped);
// both directions, each its own mask. JIT gradients against central differences of the
// interpreter's training loss, drawing the same masks from the seed.
TEST(Gradients, AWeightsDropoutMatchesCentralDifferencesWithTheRunsMask) {
  auto cell = frontend::parseCell(R"(cell weightdrop(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size], b[hidden_size]
  h2 = tanh(linear(x, w, b) + linear(h, dropout(u, 0.4)))
  return h = h2; output h2
})",
                                  "weightdrop.cell");
  const int64_t hidden = 4;
  TensorMap weights;
  GradientRequest request = bidirectionalRequest(weights, 31, 4, 2, 3, hidden);
  LayerOptions options;
  options.bidirectional = true;
  options.training = true;
  options.seed = 13;
  expectCentralDifferences(*cell, request, options);
  // Where the mask dropped an entry of u, nothing reaches it.
  options.engine = Engine::Jit;
  const GradientResult result = runGradients(*cell, request, options);
  std::vector<float> mask(static_cast<size_t>(hidden));
  int64_t dropped = 0;
  for (int64_t r = 0; r < hidden; ++r) {
    fillDropoutMaskRow(options.maskSeedOf(0), 0, static_cast<uint64_t>(r), 0.4, mask.data(),
                       hidden);
    for (int64_t c = 0; c < hidden; ++c)
      if (mask[static_cast<size_t>(c)] == 0.0f) {
        ++dropped;
        EXPECT_EQ(result.gradients.at("u_l0").data()[r * hidden + c], 0.0f) << r << ", " << c;
      }
  }
  EXPECT_GT(dropped, 0);
}

// A call's own seed: one program draws each call's masks (in the cell, and between layers)
// from the seed it is given, as a program built with that seed does, and its backward reuses
// them; on the JIT and the interpreter. A cell that drops a weight drew that mask when it was
// built: another seed is refused there.
TEST(Gradients, ACallsSeedDrawsItsMasksFromOneProgram) {
  auto cell = frontend::parseCell(test::kDroppingCell, "dropping.cell");
  std::mt19937 rng(37);
  const int64_t steps = 5, batch = 3, input = 4, hidden = 6;
  TensorMap weights;
  for (const char* suffix : {"_l0", "_l1"}) {
    const int64_t width = suffix[2] == '0' ? input : hidden;
    weights[std::string("w") + suffix] = test::randomTensor({hidden, width}, rng, 0.5f);
    weights[std::string("u") + suffix] = test::randomTensor({hidden, hidden}, rng, 0.5f);
    weights[std::string("b") + suffix] = test::randomTensor({hidden}, rng, 0.3f);
  }
  const Tensor x = test::randomTensor({steps, batch, input}, rng, 1.0f);
  GradientInputs given;
  given.output = test::randomTensor({steps, batch, hidden}, rng, 1.0f);
  for (Engine engine : {Engine::Jit, Engine::Interpreter}) {
    SCOPED_TRACE(engineName(engine));
    LayerOptions options;
    options.engine = engine;
    options.numLayers = 2;
    options.dropout = 0.4;
    options.training = true;
    options.seed = 5;
    auto shared = GradientProgram::build(*cell, weights, "weights", options);
    options.seed = 9;
    auto own = GradientProgram::build(*cell, weights, "weights", options);
    const TrainingTape a = shared->forward(x, {}, std::nullopt, {}, 9);
    const TrainingTape b = own->forward(x, {}, std::nullopt);
    const TrainingTape c = shared->forward(x, {}, std::nullopt);
    EXPECT_EQ(a.seed, 9u);
    EXPECT_EQ(a.forward.output.values(), b.forward.output.values());
    EXPECT_GT(test::maxAbsDiff(a.forward.output, c.forward.output), 1e-3f); // seed 5's masks
    const TensorMap fromShared = shared->backward(a, given), fromOwn = own->backward(b, given);
    for (const auto& [name, gradient] : fromOwn) {
      SCOPED_TRACE(name);
      EXPECT_EQ(fromShared.at(name).values(), gradient.values());
    }
  }

  auto dropsWeight = frontend::parseCell(R"(cell weightdrop(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size]
  return h = tanh(linear(x, w) + linear(h, dropout(u, 0.4))); output h
})",
                                         "weightdrop.cell");
  TensorMap weightDrop{{"w", weights.at("w_l0")}, {"u", weights.at("u_l0")}};
  LayerOptions options;
  options.training = true;
  options.seed = 5;
  auto program = GradientProgram::build(*dropsWeight, weightDrop, "weights", options);
  EXPECT_TRUE(program->drawsMasksAtBuild());
  EXPECT_FALSE(GradientProgram::build(*cell, weights, "weights", options)->drawsMasksAtBuild());
  program->forward(x, {}, std::nullopt, {}, 5); // its own seed
  test::expectUserError([&] { program->forward(x, {}, std::nullopt, {}, 6); },
                        {"cell 'weightdrop' drops parameters (a weight's dropout), whose masks "
                         "were drawn from seed 5 when the layer was built: build it again for "
                         "seed 6"});
}

// The input reaches the loss only through its dropout: its gradient is zero exactly where the
// mask dropped it (about p of the entries), on the JIT and the interpreter alike; and keeping
// only the states (ForwardValues::Recompute) still reads the forward's masks.
TEST(Gradients, AnInputsGradientIsZeroWhereItsDropoutDroppedIt) {
  auto cell = frontend::parseCell(test::kDroppingCell, "dropping.cell");
  std::mt19937 rng(19);
  const int64_t steps = 16, batch = 8, input = 32, hidden = 8;
  TensorMap weights =
      test::randomWeights(*cell, {{"input_size", input}, {"hidden_size", hidden}}, rng);
  GradientRequest request;
  request.weights = &weights;
  request.input = test::randomTensor({steps, batch, input}, rng, 1.0f);
  request.gradOutput = test::randomTensor({steps, batch, hidden}, rng, 1.0f);
  LayerOptions options;
  options.training = true;
  options.seed = 4;
  options.engine = Engine::Jit;
  const Tensor jit = runGradients(*cell, request, options).gradients.at("input");
  int64_t zeros = 0;
  for (float g : jit.values())
    zeros += g == 0.0f;
  EXPECT_NEAR(static_cast<double>(zeros) / jit.numel(), 0.3, 0.03);

  options.engine = Engine::Interpreter;
  const Tensor interpreted = runGradients(*cell, request, options).gradients.at("input");
  EXPECT_LT(test::maxAbsDiff(jit, interpreted), 1e-5);
  for (Engine engine : {Engine::Jit, Engine::Interpreter}) {
    options.engine = engine;
    auto program = GradientProgram::build(*cell, weights, "weights", options,
                                          passes::ForwardValues::Recompute);
    TrainingTape tape = program->forward(request.input, {}, std::nullopt);
    TensorMap recomputed = program->backward(tape, {request.gradOutput, {}});
    EXPECT_LT(test::maxAbsDiff(recomputed.at("input"), jit), 1e-5) << engineName(engine);
    EXPECT_LT(test::maxAbsDiff(recomputed.at("u"),
                               runGradients(*cell, request, options).gradients.at("u")),
              1e-5)
        << engineName(engine);
  }
}

// A side input every layer and direction reads: its gradient sums theirs. Two layers, both
// directions, lengths, batch_first.
TEST(Gradients, SideInputsOfAStackMatchCentralDifferences) {
  auto cell = frontend::parseCell(R"(cell ctx(input_size, context_size, hidden_size) {
  input x[input_size], ctx[context_size]
  state h[hidden_size]
  param weight_ih[hidden_size, input_size], weight_ch[hidden_size, context_size]
  param weight_hh[hidden_size, hidden_size], bias_ih[hidden_size]
  h2 = tanh(linear(x, weight_ih, bias_ih) + ctx @ weight_ch^T + linear(h, weight_hh))
  return h = h2; output h2
})",
                                  "ctx.cell");
  std::mt19937 rng(9);
  const int64_t steps = 3, batch = 3, input = 2, context = 3, hidden = 4;
  TensorMap weights;
  for (int layer = 0; layer < 2; ++layer)
    for (const char* suffix : {"", "_reverse"}) {
      std::string s = "_l" + std::to_string(layer) + suffix;
      weights["weight_ih" + s] =
          test::randomTensor({hidden, layer ? 2 * hidden : input}, rng, 0.6f);
      weights["weight_ch" + s] = test::randomTensor({hidden, context}, rng, 0.6f);
      weights["weight_hh" + s] = test::randomTensor({hidden, hidden}, rng, 0.6f);
      weights["bias_ih" + s] = test::randomTensor({hidden}, rng, 0.6f);
    }
  GradientRequest request;
  request.weights = &weights;
  request.input = test::randomTensor({batch, steps, input}, rng, 1.0f);
  request.sideInputs["ctx"] = test::randomTensor({batch, steps, context}, rng, 1.0f);
  request.initialStates["h"] = test::randomTensor({4, batch, hidden}, rng, 0.5f);
  request.gradOutput = test::randomTensor({batch, steps, 2 * hidden}, rng, 1.0f);
  request.gradFinalStates["h"] = test::randomTensor({4, batch, hidden}, rng, 1.0f);
  request.lengths = Int64Array{{batch}, {2, 3, 1}};
  LayerOptions options;
  options.batchFirst = true;
  expectCentralDifferences(*cell, request, options);
}

// Gradients come back by name: a side input named as another gradient (h0, the initial state
// h's) would share its entry. Refused when the program is built, naming both; it ran into an
// internal error ("gradient shapes differ").
TEST(Gradients, ASideInputNamedAsAnotherGradientIsRefused) {
  auto cell = frontend::parseCell(R"(cell clash(n) {
  input x[n], h0[n]
  state h[n]
  param w[n, n]
  return h = tanh(linear(x + h0, w) + h); output h
})",
                                  "clash.cell");
  TensorMap weights{{"w", Tensor({3, 3}, 0.5f)}};
  LayerOptions options;
  options.engine = Engine::Interpreter;
  test::expectUserError([&] { GradientProgram::build(*cell, weights, "weights", options); },
                        {"cell 'clash': side input 'h0' has the name of initial state h's "
                         "gradient; rename the input to train the cell"});
}

// backward() into sums: each parameter's gradient added into its sum in place, over several
// calls (a decoder's steps in one graph, rnnc/_autograd.py), equals the sum of the plain
// backwards' gradients; the other gradients are the plain ones, and no parameter's is returned.
// Every kind of parameter gradient: a product's weight (linear, and `@`'s [K, N] weight), a
// vector's column sums, a weight made of parameters (w_ih * s), in two layers both ways.
TEST(Gradients, SumsOfParameterGradientsAddUpTheBackwardCalls) {
  auto cell = frontend::parseCell(R"(cell summed(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w_ih[hidden_size, input_size], s[input_size], v[hidden_size, hidden_size]
  param b[hidden_size]
  h2 = tanh(linear(x, w_ih * s, b) + h @ v)
  return h = h2; output h2
})",
                                  "summed.cell");
  const int64_t steps = 4, batch = 3, input = 5, hidden = 6;
  std::mt19937 rng(29);
  TensorMap weights;
  for (const char* suffix : {"_l0", "_l0_reverse", "_l1", "_l1_reverse"}) {
    const int64_t width = suffix[2] == '0' ? input : 2 * hidden;
    weights[std::string("w_ih") + suffix] = test::randomTensor({hidden, width}, rng, 0.5f);
    weights[std::string("s") + suffix] = test::randomTensor({width}, rng, 1.0f);
    weights[std::string("v") + suffix] = test::randomTensor({hidden, hidden}, rng, 0.5f);
    weights[std::string("b") + suffix] = test::randomTensor({hidden}, rng, 0.3f);
  }
  LayerOptions options;
  options.numLayers = 2;
  options.bidirectional = true;
  auto program = GradientProgram::build(*cell, weights, "random weights", options);
  std::vector<TrainingTape> tapes;
  std::vector<GradientInputs> given(2);
  std::vector<TensorMap> plain;
  for (GradientInputs& g : given) {
    tapes.push_back(program->forward(test::randomTensor({steps, batch, input}, rng, 1.0f),
                                     {{"h", test::randomTensor({4, batch, hidden}, rng, 0.5f)}},
                                     std::nullopt));
    g.output = test::randomTensor({steps, batch, 2 * hidden}, rng, 1.0f);
    plain.push_back(program->backward(tapes.back(), g));
  }

  TensorMap sums;
  for (size_t call = 0; call < 2; ++call) {
    const TensorMap rest = program->backward(tapes[call], given[call], sums);
    for (const auto& [name, gradient] : plain[call]) {
      SCOPED_TRACE(name);
      if (weights.count(name)) {
        EXPECT_EQ(rest.count(name), 0u);
        continue;
      }
      ASSERT_EQ(rest.count(name), 1u);
      EXPECT_EQ(rest.at(name).values(), gradient.values());
    }
  }
  ASSERT_EQ(sums.size(), weights.size());
  for (const auto& [name, weight] : weights) {
    SCOPED_TRACE(name);
    Tensor expected = plain[0].at(name);
    for (int64_t i = 0; i < expected.numel(); ++i)
      expected.data()[i] += plain[1].at(name).data()[i];
    ASSERT_EQ(sums.at(name).shape(), weight.shape());
    EXPECT_LT(test::maxAbsDiff(sums.at(name), expected), 1e-5f);
    EXPECT_GT(test::maxAbsDiff(sums.at(name), plain[0].at(name)), 1e-3f); // both calls are in
  }

  sums["v_l1"] = Tensor({hidden, hidden + 1});
  test::expectUserError(
      [&] { program->backward(tapes[0], given[0], sums); },
      {"the sum of parameter v_l1's gradients has shape [6, 7], expected [6, 6]"});
}

// ---- The C++ API: forwardTraining, then backward -------------------------------------------

TEST(Gradients, TheApiGivesPyTorchsGradients) {
  const std::string name = "lstm_l2_bi_len";
  rnnc::LayerSpec spec;
  spec.threads = 2;
  rnnc::Layer layer = rnnc::Layer::fromFile(spec, fixture(name, "weights.safetensors"));
  Tensor x = readNpyFloat32(fixture(name, "input.npy"));
  Tensor h0 = readNpyFloat32(fixture(name, "h0.npy")), c0 = readNpyFloat32(fixture(name, "c0.npy"));
  Int64Array lengths = readNpyInt64(fixture(name, "lengths.npy"));
  const int64_t steps = x.dim(0), batch = x.dim(1);
  Tensor y({steps, batch, layer.outputSize()}), hn(h0.shape()), cn(c0.shape());
  rnnc::TrainingRecord record =
      layer.forwardTraining(x.data(), steps, batch, h0.data(), c0.data(), lengths.values.data(),
                            y.data(), hn.data(), cn.data());
  // Per step and sequence, 2 layers x 2 directions of four gates and c (cuDNN's reserve space),
  // and layer 0's output both as written (its h) and as layer 1's input: y and x are the
  // caller's.
  const int64_t hidden = hn.dim(2);
  EXPECT_EQ(record.workspaceBytes(),
            steps * batch * (4 * 5 * hidden + 2 * hidden + 2 * hidden) * int64_t{sizeof(float)});
  // The forward's results are inference's.
  Tensor yInference(y.shape());
  layer.forward(x.data(), steps, batch, h0.data(), c0.data(), lengths.values.data(),
                yInference.data(), nullptr, nullptr);
  EXPECT_LT(test::maxAbsDiff(y, yInference), 1e-6);

  Tensor gy = readNpyFloat32(fixture(name, "grad_output.npy"));
  Tensor ghn = readNpyFloat32(fixture(name, "grad_hn.npy"));
  Tensor gcn = readNpyFloat32(fixture(name, "grad_cn.npy"));
  TensorMap actual;
  for (auto& [key, w] : layer.backward(record, gy.data(), ghn.data(), gcn.data()))
    actual[key] = Tensor(w.shape, w.values);
  expectGradientsMatch(actual, readSafeTensors(fixture(name, "grads.safetensors")));
  // A record is reusable: the same gradients again.
  auto again = layer.backward(record, gy.data(), ghn.data(), gcn.data());
  EXPECT_EQ(
      again.at("weight_hh_l1_reverse").values,
      layer.backward(record, gy.data(), ghn.data(), gcn.data()).at("weight_hh_l1_reverse").values);
}

// Mixed precision through the API (LayerSpec::weightsDtype "bf16" in forwardTraining and
// backward): the JIT's gradients are those of the interpreter computing its products alike, and
// its training forward gives inference's output.
TEST(Gradients, TheApiTrainsInMixedPrecision) {
  const std::string name = "gru_l2_bi_bf_len";
  Tensor x = readNpyFloat32(fixture(name, "input.npy"));
  Tensor h0 = readNpyFloat32(fixture(name, "h0.npy"));
  Int64Array lengths = readNpyInt64(fixture(name, "lengths.npy"));
  Tensor gy = readNpyFloat32(fixture(name, "grad_output.npy"));
  Tensor ghn = readNpyFloat32(fixture(name, "grad_hn.npy"));
  std::map<std::string, Tensor> results[2];
  for (bool jit : {true, false}) {
    rnnc::LayerSpec spec;
    spec.batchFirst = true;
    spec.cell = "gru";
    spec.jit = jit;
    spec.weightsDtype = "bf16";
    rnnc::Layer layer = rnnc::Layer::fromFile(spec, fixture(name, "weights.safetensors"));
    const int64_t batch = x.dim(0), steps = x.dim(1);
    Tensor y({batch, steps, layer.outputSize()}), hn(h0.shape());
    rnnc::TrainingRecord record =
        layer.forwardTraining(x.data(), steps, batch, h0.data(), nullptr, lengths.values.data(),
                              y.data(), hn.data(), nullptr);
    Tensor yInference(y.shape());
    layer.forward(x.data(), steps, batch, h0.data(), nullptr, lengths.values.data(),
                  yInference.data(), nullptr, nullptr);
    EXPECT_LT(test::maxAbsDiff(y, yInference), 1e-6) << (jit ? "jit" : "interpreter");
    for (auto& [key, w] : layer.backward(record, gy.data(), ghn.data(), nullptr))
      results[jit ? 0 : 1][key] = Tensor(w.shape, w.values);
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  for (const auto& [key, want] : results[1]) {
    float scale = 1e-6f;
    for (float v : want.values())
      scale = std::max(scale, std::abs(v));
    EXPECT_LT(test::maxAbsDiff(results[0].at(key), want) / scale, 2e-3f) << key;
  }
}

// A decoder trained step by step through the API: one forwardTraining() and one backward() per
// step, the state's gradient carried back by hand. Passing a GradientSums to each backward()
// gives the sum of what the plain backward() gives the parameters, and the same input and state
// gradients; a layer whose parameters differ in shape cannot add into them, and the sums it
// failed on are refused.
TEST(Gradients, TheApiSumsADecodersParameterGradientsInPlace) {
  const int64_t batch = 2, input = 3, hidden = 5, steps = 6;
  std::mt19937 rng(31);
  auto weightsOf = [&](int64_t h) {
    std::map<std::string, rnnc::WeightTensor> weights;
    for (const auto& [name, shape] :
         std::map<std::string, TensorShape>{{"weight_ih_l0", {3 * h, input}},
                                            {"weight_hh_l0", {3 * h, h}},
                                            {"bias_ih_l0", {3 * h}},
                                            {"bias_hh_l0", {3 * h}}}) {
      Tensor t = test::randomTensor(shape, rng, 0.5f);
      weights[name] = {shape, std::vector<float>(t.values().begin(), t.values().end())};
    }
    return weights;
  };
  rnnc::LayerSpec spec;
  spec.cell = "gru";
  spec.threads = 1;
  rnnc::Layer layer = rnnc::Layer::fromWeights(spec, weightsOf(hidden));
  std::vector<rnnc::TrainingRecord> records;
  std::vector<Tensor> gradOutputs;
  Tensor h({1, batch, hidden}), y({1, batch, hidden}), next({1, batch, hidden});
  for (int64_t t = 0; t < steps; ++t) {
    const Tensor x = test::randomTensor({1, batch, input}, rng, 1.0f);
    records.push_back(layer.forwardTraining(x.data(), 1, batch, h.data(), nullptr, nullptr,
                                            y.data(), next.data(), nullptr));
    h = next;
    gradOutputs.push_back(test::randomTensor({1, batch, hidden}, rng, 1.0f));
  }

  // Backwards through the steps, each given the state gradient the step after it gave.
  auto backThrough = [&](rnnc::GradientSums* sums) {
    std::vector<std::map<std::string, rnnc::WeightTensor>> perStep(steps);
    std::vector<float> gradH(batch * hidden, 0.0f);
    for (int64_t t = steps - 1; t >= 0; --t) {
      const std::map<std::string, const float*> finals{{"h", gradH.data()}};
      const float* gy = gradOutputs[t].data();
      perStep[t] = sums ? layer.backward(records[t], gy, finals, *sums)
                        : layer.backward(records[t], gy, finals);
      gradH = perStep[t].at("h0").values;
    }
    return perStep;
  };
  const auto plain = backThrough(nullptr);
  rnnc::GradientSums sums;
  EXPECT_TRUE(sums.empty());
  const auto summed = backThrough(&sums);
  EXPECT_FALSE(sums.empty());
  for (int64_t t = 0; t < steps; ++t) {
    EXPECT_EQ(summed[t].at("h0").values, plain[t].at("h0").values);
    EXPECT_EQ(summed[t].at("input").values, plain[t].at("input").values);
    EXPECT_EQ(summed[t].count("weight_hh_l0"), 0u);
  }
  const std::map<std::string, rnnc::WeightTensor> totals = sums.take();
  EXPECT_TRUE(sums.empty());
  ASSERT_EQ(totals.size(), 4u);
  for (const auto& [name, total] : totals) {
    SCOPED_TRACE(name);
    std::vector<float> expected(total.values.size(), 0.0f);
    for (int64_t t = 0; t < steps; ++t)
      for (size_t i = 0; i < expected.size(); ++i)
        expected[i] += plain[t].at(name).values[i];
    EXPECT_EQ(total.shape, plain[0].at(name).shape);
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_NEAR(total.values[i], expected[i], 1e-5f * (1 + std::abs(expected[i])));
  }

  rnnc::Layer wider = rnnc::Layer::fromWeights(spec, weightsOf(hidden + 1));
  Tensor hw({1, batch, hidden + 1}), yw({1, batch, hidden + 1});
  const Tensor x = test::randomTensor({1, batch, input}, rng, 1.0f);
  rnnc::TrainingRecord other = wider.forwardTraining(x.data(), 1, batch, nullptr, nullptr, nullptr,
                                                     yw.data(), hw.data(), nullptr);
  layer.backward(records[0], gradOutputs[0].data(), {}, sums);
  test::expectUserError([&] { wider.backward(other, yw.data(), {}, sums); },
                        {"the sum of parameter", "gradients has shape [15, 3], expected [18, 3]"});
  test::expectUserError([&] { sums.take(); }, {"these gradient sums are incomplete"});
}

} // namespace
} // namespace rnnc

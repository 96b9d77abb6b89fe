// Passes on IR text (IR in, expected IR out, and the interpreter's results the same on both):
// the cases in tests/passes/*.ir through `rnnc compile --passes`, and here the ones that need
// code (generated cells, hand-grouped kernels); and numerically: the reference interpreter gives
// the same results before and after the whole pipeline.
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "ir/Error.h"
#include "ir/IRParser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/CommonSubexpressionElimination.h"
#include "passes/DeadCodeElimination.h"
#include "passes/Fuse.h"
#include "passes/FuseMatMul.h"
#include "passes/MergeGates.h"
#include "passes/PassManager.h"
#include "passes/Premultiply.h"
#include "passes/Simplify.h"
#include "passes/SinkSlices.h"
#include "runtime/exec/Interpreter.h"
#include "tests/RunSequence.h"
#include "tests/TestSupport.h"
#include "tests/ToolRunner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>
#include <sstream>

using namespace rnnc;

namespace {

// What the reference interpreter computes for `cell` (its sizes bound to `size`, B = 3, T = 4)
// on inputs, states and parameters drawn from `seed`: the outputs, then each final state.
// `training`: dropouts draw masks (from `seed` too).
std::vector<Tensor> interpret(const ir::Cell& unbound, int64_t size, unsigned seed,
                              bool training = false) {
  auto cell = unbound.clone();
  ir::SizeMap sizes;
  for (const std::string& name : cell->sizeNames)
    sizes[name] = size;
  cell->bindSizes(sizes);
  sizes[ir::kBatchSymbol] = 3;
  std::mt19937 rng(seed);
  TensorMap weights = test::randomWeights(*cell, sizes, rng);
  std::vector<Tensor> params, inputs, states;
  for (const auto& p : cell->params)
    params.push_back(weights.at(p->name));
  for (const auto& x : cell->inputs)
    inputs.push_back(test::randomTensor({4, 3, *x->shape.back().evaluate(sizes)}, rng));
  for (const auto& h : cell->states)
    states.push_back(test::randomTensor({3, *h->shape.back().evaluate(sizes)}, rng));
  std::vector<Tensor> results = {
      Interpreter(*cell, params, ExecutionOptions{training, seed}).run(inputs, states)};
  results.insert(results.end(), states.begin(), states.end());
  return results;
}

// Parses `input`, runs `pass`, and compares the printed result with `expected` (parsed and
// printed too, so that both sides are in canonical form); then checks that the pass kept the
// meaning: the interpreter gives the same outputs and final states before and after it.
void checkPass(bool (*pass)(ir::Cell&), const std::string& input, const std::string& expected,
               bool expectChanged = true) {
  auto cell = ir::parseIR(input, "<input>");
  bool changed = pass(*cell);
  ir::verify(*cell);
  EXPECT_EQ(ir::toString(*cell), ir::toString(*ir::parseIR(expected, "<expected>")));
  EXPECT_EQ(changed, expectChanged);
  auto before = ir::parseIR(input, "<input>");
  for (int64_t size : {1, 5}) {
    std::vector<Tensor> want = interpret(*before, size, 17), got = interpret(*cell, size, 17);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_LT(test::maxAbsDiff(got[i], want[i]), 1e-5)
          << (i == 0 ? "outputs" : "final state " + std::to_string(i - 1)) << ", sizes " << size;
  }
}

// A sum of thousands of terms (a generated cell's) goes through the pipeline in time linear in
// its size: reassociation once walked the add tree from each of its nodes and counted each
// node's uses over the whole cell (cubic: 2,000 terms took 16 s, 20,000 never finished).
TEST(Premultiply, ReassociatesSumsOfThousandsOfTerms) {
  const int terms = 5000;
  std::string sum = "x";
  for (int i = 0; i < terms; ++i)
    sum += " + h";
  auto cell =
      frontend::parseCell("cell c(n) {\n  input x[n]\n  state h[n]\n  param b[n]\n  y = " + sum +
                              " + b\n  return h = y; output y\n}\n",
                          "long.cell");
  ASSERT_TRUE(passes::premultiply(*cell));
  ir::verify(*cell);
  int stepAdds = 0, preAdds = 0;
  for (const auto& instr : cell->step)
    stepAdds += instr->op == ir::Op::Add;
  for (const auto& instr : cell->pre)
    preAdds += instr->op == ir::Op::Add;
  // No product to hoist: x + b stays in the loop, summed first (reassociated), then one add per
  // state term: h + ... + h + (x + b).
  EXPECT_EQ(preAdds, 0);
  EXPECT_EQ(stepAdds, terms + 1);
}

TEST(Fuse, TheLstmStepIsOneProductAndOneKernel) {
  auto lstm = frontend::loadCell("lstm");
  std::ostringstream log;
  passes::runPipeline(*lstm, {}, log);
  ASSERT_EQ(lstm->step.size() > 1, true);
  EXPECT_EQ(lstm->step[0]->op, ir::Op::Linear);
  EXPECT_EQ(lstm->step[0]->operands[0], lstm->states[0].get()); // h @ W_hh^T
  for (size_t i = 1; i < lstm->step.size(); ++i)
    EXPECT_EQ(lstm->step[i]->kernel, lstm->step[1]->kernel) << ir::toString(*lstm);
  EXPECT_GE(lstm->step[1]->kernel, 0);
  // fuse-matmul: the product computes its tiles inside the same kernel.
  EXPECT_EQ(lstm->step[0]->kernel, lstm->step[1]->kernel);
}

TEST(FuseMatMul, LeavesProductsTheKernelCannotTile) {
  // A product the output reads whole; one read at a width other than the kernel's; one whose
  // kernel normalises rows (its statistics need whole rows first).
  const char* escapes = R"(cell @t(n) {
  state %h : [B, n]
  param %u : [n, n]
  step {
    %0 = linear %h, %u : [B, n]
    fused {
      %1 = slice %0 {offset = 0} : [B, n]
      %2 = tanh %1 : [B, n]
    }
  }
  yield %h = %2
  output %0
}
)";
  checkPass(passes::fuseMatMul, escapes, escapes, /*expectChanged=*/false);
  const char* otherWidth = R"(cell @t(n) {
  state %h : [B, 2*n]
  param %u : [2*n, 2*n]
  param %g : [n]
  step {
    %0 = linear %h, %u : [B, 2*n]
    fused {
      %1 = slice %0 {offset = 0} : [B, n]
      %2 = slice %0 {offset = 0} : [B, 2*n]
      %3 = mul %1, %g : [B, n]
    }
    %4 = concat %3, %3 : [B, 2*n]
    fused {
      %5 = add %4, %2 : [B, 2*n]
    }
  }
  yield %h = %5
  output %5
}
)";
  checkPass(passes::fuseMatMul, otherWidth, otherWidth, /*expectChanged=*/false);
  const char* normalised = R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %u : [2*n, n]
  step {
    %0 = linear %h, %u : [B, 2*n]
    fused {
      %1 = layernorm %x {eps = 1e-05} : [B, n]
      %2 = slice %0 {offset = n} : [B, n]
      %3 = add %1, %2 : [B, n]
    }
  }
  yield %h = %3
  output %3
}
)";
  checkPass(passes::fuseMatMul, normalised, normalised, /*expectChanged=*/false);
}

// tests/passes/*.ir: IR in, passes, IR out, through the tool (`rnnc compile --emit=ir-opt
// --passes=...`). A file is
//   # passes: NAME[,NAME...]     the passes to run, in order; the last is the one under test
//   # unchanged                  (optional) the last pass changes nothing
//   # ... any other comment: what the case shows
//   <the input IR>
//   # expected:
//   <the expected IR>
// The tool's output must print as the expected IR does (both parsed and printed, so in canonical
// form), and the reference interpreter must give the same outputs and final states on the input
// and the output (every size 1, then 5). To add a case, drop a file in tests/passes/.
const std::filesystem::path kPassFilesDir =
    std::filesystem::path(RNNC_SOURCE_DIR) / "tests" / "passes";

std::vector<std::string> passFiles() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(kPassFilesDir))
    if (entry.is_regular_file() && entry.path().extension() == ".ir")
      names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

class PassFile : public test::ScratchDirTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(PassFile, GivesTheExpectedIRAndKeepsTheMeaning) {
  const std::string file = (kPassFilesDir / (GetParam() + ".ir")).string();
  const std::string text = readBytes(file);
  const std::string marker = "# expected:\n";
  const size_t split = text.find(marker);
  ASSERT_NE(split, std::string::npos) << file << ": no '# expected:' line";
  const std::string input = text.substr(0, split), expected = text.substr(split + marker.size());
  std::string passList;
  bool unchanged = false, training = false; // "# training": the meaning in training mode
  std::istringstream header(input);
  for (std::string line; std::getline(header, line) && line.rfind("#", 0) == 0;) {
    if (line.rfind("# passes: ", 0) == 0)
      passList = line.substr(10);
    unchanged = unchanged || line == "# unchanged";
    training = training || line == "# training";
  }
  ASSERT_FALSE(passList.empty()) << file << ": no '# passes: NAME' line";

  writeBytes("input.rnnir", input);
  test::ToolResult r = test::ToolRunner(path("")).run(
      {"compile", "input.rnnir", "--emit=ir-opt", "--passes=" + passList, "--print-after-all"});
  ASSERT_EQ(r.exitCode, 0) << r.command << "\n" << r.err;
  auto output = ir::parseIR(r.out, "<rnnc compile's output>");
  EXPECT_EQ(ir::toString(*output), ir::toString(*ir::parseIR(expected, file + " (expected)")))
      << file;
  // The last pass is the one under test (any before it set up its input); its log line says
  // "(unchanged)" when it changed nothing.
  std::string lastLog;
  std::istringstream log(r.err);
  for (std::string line; std::getline(log, line);)
    if (line.rfind("// ----- IR after ", 0) == 0)
      lastLog = line;
  EXPECT_EQ(lastLog.find("(unchanged)") != std::string::npos, unchanged)
      << file << (unchanged ? ": the last pass changed the IR" : ": the last pass changed nothing");

  auto before = ir::parseIR(input, file);
  for (int64_t size : {1, 5}) {
    std::vector<Tensor> want = interpret(*before, size, 17, training),
                        got = interpret(*output, size, 17, training);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_LT(test::maxAbsDiff(got[i], want[i]), 1e-5)
          << file << ": " << (i == 0 ? "outputs" : "final state " + std::to_string(i - 1))
          << ", sizes " << size;
  }
}

INSTANTIATE_TEST_SUITE_P(PassFiles, PassFile, ::testing::ValuesIn(passFiles()),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(IRParser, ReadsFusedRegionsBack) {
  auto lstm = frontend::loadCell("lstm");
  std::ostringstream log;
  passes::runPipeline(*lstm, {}, log);
  std::string printed = ir::toString(*lstm);
  EXPECT_NE(printed.find("    fused {\n"), std::string::npos);
  EXPECT_EQ(ir::toString(*ir::parseIR(printed)), printed);
}

// Every pass has its own name (so --disable-pass and --print-after choose one), and --no-fuse
// and --no-premul switch off exactly their groups.
TEST(PassManager, NamesAreUniqueAndGroupsSwitchOffTogether) {
  std::set<std::string> names;
  int fusion = 0, premultiply = 0, training = 0;
  for (const passes::Pass& pass : passes::allPasses()) {
    EXPECT_TRUE(names.insert(pass.name).second) << pass.name << " is listed twice";
    fusion += pass.group == passes::PassGroup::Fusion;
    premultiply += pass.group == passes::PassGroup::Premultiply;
    training += pass.group == passes::PassGroup::Training;
  }
  EXPECT_EQ(fusion, 3);
  EXPECT_EQ(premultiply, 1);
  EXPECT_EQ(training, 1);
  passes::PipelineOptions noFuse, noPremul, oneCse;
  noFuse.fuse = false;
  noPremul.premultiply = false;
  oneCse.disabled = {"premultiply-cse"};
  // The training pass runs only by name (--passes), never in the pipeline.
  const size_t all = passes::allPasses().size() - 1;
  for (const passes::Pass& pass : passes::buildPipeline({}))
    EXPECT_NE(pass.group, passes::PassGroup::Training) << pass.name;
  EXPECT_EQ(passes::buildPipeline(noFuse).size(), all - 3);
  for (const passes::Pass& pass : passes::buildPipeline(noFuse))
    EXPECT_NE(pass.group, passes::PassGroup::Fusion) << pass.name;
  EXPECT_EQ(passes::buildPipeline(noPremul).size(), all - 1);
  std::vector<passes::Pass> withoutOne = passes::buildPipeline(oneCse);
  ASSERT_EQ(withoutOne.size(), all - 1);
  EXPECT_TRUE(std::any_of(withoutOne.begin(), withoutOne.end(),
                          [](const passes::Pass& p) { return p.name == "cleanup-cse"; }));
}

TEST(PassManager, PrintsAfterEachPassAndRejectsUnknownNames) {
  auto lstm = frontend::loadCell("lstm");
  passes::PipelineOptions options;
  options.printAfterAll = true;
  std::ostringstream log;
  passes::runPipeline(*lstm, options, log);
  EXPECT_NE(log.str().find("// ----- IR after simplify (unchanged) -----"), std::string::npos);
  EXPECT_NE(log.str().find("// ----- IR after premultiply -----\ncell @lstm"), std::string::npos);
  // The input product, fused with the kernel that adds the summed biases to it.
  ASSERT_EQ(lstm->pre.size(), 4u) << ir::toString(*lstm);
  EXPECT_EQ(lstm->pre[0]->op, ir::Op::Linear);
  EXPECT_EQ(lstm->pre[0]->kernel, lstm->pre[3]->kernel);
  EXPECT_EQ(lstm->pre[1]->op, ir::Op::Add);
  EXPECT_EQ(lstm->pre[1]->operands[0]->name, "bias_ih");
  EXPECT_EQ(lstm->pre[1]->operands[1]->name, "bias_hh");

  options.disabled = {"premul"};
  EXPECT_THROW(passes::runPipeline(*lstm, options, log), UserError);
}

// --passes: exactly the named passes, in the order given (a pass may come twice), whatever the
// group switches say; an unknown name is refused like everywhere else.
TEST(PassManager, OnlyRunsTheNamedPassesInTheirOrder) {
  passes::PipelineOptions options;
  options.only = {"dce", "fuse", "dce"};
  options.fuse = false;
  std::vector<std::string> names;
  for (const passes::Pass& pass : passes::buildPipeline(options))
    names.push_back(pass.name);
  EXPECT_EQ(names, (std::vector<std::string>{"dce", "fuse", "dce"}));
  options.only = {"dce", "premul"};
  test::expectUserError([&] { passes::buildPipeline(options); },
                        {"--passes: no pass named 'premul'"});
}

TEST(PassManager, NoPremulKeepsEverythingInTheLoop) {
  auto lstm = frontend::loadCell("lstm");
  passes::PipelineOptions options;
  options.premultiply = false;
  std::ostringstream log;
  passes::runPipeline(*lstm, options, log);
  EXPECT_TRUE(lstm->pre.empty());
}

// --no-premul keeps the input projection in the loop, not the arithmetic of parameters: a
// weight made of parameters is computed once, before the loop, on every pipeline.
TEST(PassManager, NoPremulStillComputesAWeightMadeOfParametersBeforeTheLoop) {
  auto cell = frontend::parseCell(R"(cell d(n) {
  input x[n]
  state h[n]
  param w[n, n], u[n, n], v[n, n]
  h2 = tanh(linear(x, w) + linear(h, 0.5 * u + tanh(v)))
  return h = h2; output h2
})",
                                  "derived.cell");
  passes::PipelineOptions options;
  options.premultiply = false;
  std::ostringstream log;
  passes::runPipeline(*cell, options, log);
  ASSERT_FALSE(cell->pre.empty()) << ir::toString(*cell);
  for (const auto& instr : cell->pre)
    EXPECT_FALSE(instr->result.isBatched()) << ir::toString(*cell);
  int productsInTheLoop = 0;
  for (const auto& instr : cell->step)
    if (instr->op == ir::Op::Linear) {
      ++productsInTheLoop;
      // The recurrent product's weight comes from `pre`; the input projection's is w.
      EXPECT_TRUE(instr->operands[1]->def == nullptr ||
                  std::any_of(cell->pre.begin(), cell->pre.end(),
                              [&](const auto& p) { return &p->result == instr->operands[1]; }))
          << ir::toString(*cell);
    }
  EXPECT_EQ(productsInTheLoop, 2) << ir::toString(*cell);
}

// ---- Numerics: the optimised cell computes what the original computes ----------------------

const char* kLayerNormCell = R"(cell ln(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size], g[hidden_size], b[hidden_size]
  z = layernorm(x @ w^T + 1 - 1, g, b) + layernorm(h @ u^T) * 0.5
  h2 = clamp(z, -2, 2) * 1 + 0
  return h = h2; output h2
})";

struct NumericCase {
  std::string name, source; // built-in name, or cell text
};

class PipelineNumerics : public testing::TestWithParam<NumericCase> {};

TEST_P(PipelineNumerics, OptimisedEqualsUnoptimisedOnRandomSizes) {
  const NumericCase& param = GetParam();
  auto original = param.source.empty() ? frontend::loadCell(param.name)
                                       : frontend::parseCell(param.source, param.name + ".cell");
  auto optimised = original->clone();
  std::ostringstream log;
  passes::runPipeline(*optimised, {}, log);

  std::mt19937 rng(std::hash<std::string>()(param.name));
  for (auto [steps, batch, inputSize, hidden] :
       {std::tuple{1, 1, 1, 1}, std::tuple{5, 3, 2, 17}, std::tuple{7, 5, 9, 3}}) {
    ir::SizeMap sizes = {{"input_size", inputSize},
                         {"hidden_size", hidden},
                         {"proj_size", std::max(1, hidden / 2)},
                         {"B", batch}};
    TensorMap weights = test::randomWeights(*original, sizes, rng);
    SequenceRequest request;
    request.weights = &weights;
    request.inputs["x"] = test::randomTensor({steps, batch, inputSize}, rng);
    for (const auto& s : original->states)
      request.initialStates[s->name] =
          test::randomTensor({1, batch, *s->shape[1].evaluate(sizes)}, rng);
    // The interpreter on both sides: the unoptimised cell as written, and the pipeline's IR.
    request.engine = Engine::Interpreter;
    SequenceResult expected = runSequence(*original, request);
    SequenceResult actual = runSequence(*optimised, request);
    ASSERT_EQ(actual.engine, Engine::Interpreter);
    for (int64_t i = 0; i < expected.output.numel(); ++i)
      ASSERT_NEAR(actual.output.data()[i], expected.output.data()[i], 1e-5)
          << "T=" << steps << " B=" << batch << " hidden=" << hidden << " element " << i;
    for (const auto& [name, state] : expected.finalStates)
      for (int64_t i = 0; i < state.numel(); ++i)
        ASSERT_NEAR(actual.finalStates.at(name).data()[i], state.data()[i], 1e-5) << name;
  }
}

std::vector<NumericCase> numericCases() {
  std::vector<NumericCase> cases;
  for (const auto& name : frontend::builtinCellNames())
    cases.push_back({name, ""});
  cases.push_back({"four_gate_lstm", test::kFourGateLstm});
  cases.push_back({"layernorm_cell", kLayerNormCell});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cells, PipelineNumerics, testing::ValuesIn(numericCases()),
                         [](const auto& info) { return info.param.name; });

TEST(MergeGates, ASeparateGateLstmRunsOneProductPerOperand) {
  auto cell = frontend::parseCell(test::kFourGateLstm, "lstm4.cell");
  std::ostringstream log;
  passes::runPipeline(*cell, {}, log);
  auto count = [](const ir::Block& block, ir::Op op) {
    return std::count_if(block.begin(), block.end(),
                         [&](const auto& instr) { return instr->op == op; });
  };
  EXPECT_EQ(count(cell->pre, ir::Op::Linear), 1) << ir::toString(*cell);
  EXPECT_EQ(count(cell->pre, ir::Op::Stack), 2) << ir::toString(*cell);
  EXPECT_EQ(count(cell->step, ir::Op::Linear), 1) << ir::toString(*cell);
  EXPECT_EQ(count(cell->step, ir::Op::Stack), 0) << ir::toString(*cell);
}

} // namespace

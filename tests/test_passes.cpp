// Passes on IR text (IR in, expected IR out, and the interpreter's results the same on both),
// and numerically: the reference interpreter gives the same results before and after the whole
// pipeline.
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

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <sstream>

using namespace rnnc;

namespace {

// What the reference interpreter computes for `cell` (its sizes bound to `size`, B = 3, T = 4)
// on inputs, states and parameters drawn from `seed`: the outputs, then each final state.
std::vector<Tensor> interpret(const ir::Cell& unbound, int64_t size, unsigned seed) {
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
  std::vector<Tensor> results = {Interpreter(*cell, params).run(inputs, states)};
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

const char* kHeader = R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %w : [n, n]
  param %u : [n, n]
  param %b : [n]
  param %c : [n]
)";

std::string cell(const std::string& body) {
  return kHeader + body + "}\n";
}

TEST(DeadCodeElimination, RemovesUnusedResultsTransitively) {
  checkPass(passes::eliminateDeadCode, cell(R"(  step {
    %0 = tanh %x : [B, n]
    %1 = sigmoid %0 : [B, n]
    %2 = add %x, %h : [B, n]
  }
  yield %h = %2
  output %2
)"),
            cell(R"(  step {
    %0 = add %x, %h : [B, n]
  }
  yield %h = %0
  output %0
)"));
}

TEST(DeadCodeElimination, KeepsPreResultsTheStepReads) {
  std::string text = cell(R"(  pre {
    %0 = linear %x, %w : [B, n]
    %1 = tanh %x : [B, n]
  }
  step {
    %2 = add %0, %h : [B, n]
  }
  yield %h = %2
  output %2
)");
  std::string expected = cell(R"(  pre {
    %0 = linear %x, %w : [B, n]
  }
  step {
    %1 = add %0, %h : [B, n]
  }
  yield %h = %1
  output %1
)");
  checkPass(passes::eliminateDeadCode, text, expected);
  checkPass(passes::eliminateDeadCode, expected, expected, /*expectChanged=*/false);
}

TEST(CommonSubexpressionElimination, MergesEqualInstructionsAndCommutedOperands) {
  checkPass(passes::eliminateCommonSubexpressions, cell(R"(  step {
    %0 = add %x, %h : [B, n]
    %1 = add %h, %x : [B, n]
    %2 = sigmoid %0 : [B, n]
    %3 = sigmoid %1 : [B, n]
    %4 = sub %2, %3 : [B, n]
    %5 = sub %3, %2 : [B, n]
    %6 = const {value = 1} : []
    %7 = const {value = 1} : []
    %8 = mul %4, %6 : [B, n]
    %9 = mul %5, %7 : [B, n]
    %10 = add %8, %9 : [B, n]
  }
  yield %h = %10
  output %10
)"),
            cell(R"(  step {
    %0 = add %x, %h : [B, n]
    %1 = add %h, %x : [B, n]
    %2 = sigmoid %0 : [B, n]
    %3 = sigmoid %0 : [B, n]
    %4 = sub %2, %2 : [B, n]
    %5 = sub %2, %2 : [B, n]
    %6 = const {value = 1} : []
    %7 = const {value = 1} : []
    %8 = mul %4, %6 : [B, n]
    %9 = mul %4, %6 : [B, n]
    %10 = add %8, %8 : [B, n]
  }
  yield %h = %10
  output %10
)"));
}

TEST(CommonSubexpressionElimination, KeepsDifferentAttributesApart) {
  std::string text = cell(R"(  step {
    %0 = slice %x {offset = 0} : [B, n]
    %1 = clamp %0 {lo = -1, hi = 1} : [B, n]
    %2 = clamp %0 {lo = -1, hi = 2} : [B, n]
    %3 = add %1, %2 : [B, n]
  }
  yield %h = %3
  output %3
)");
  checkPass(passes::eliminateCommonSubexpressions, text, text, /*expectChanged=*/false);
}

TEST(Simplify, FoldsConstantsAndIdentities) {
  checkPass(passes::simplify, cell(R"(  step {
    %0 = const {value = 2} : []
    %1 = const {value = 3} : []
    %2 = mul %0, %1 : []
    %3 = const {value = 6} : []
    %4 = sub %2, %3 : []
    %5 = add %x, %4 : [B, n]
    %6 = const {value = 1} : []
    %7 = mul %6, %5 : [B, n]
    %8 = neg %7 : [B, n]
    %9 = neg %8 : [B, n]
    %10 = concat %9 : [B, n]
    %11 = slice %10 {offset = 0} : [B, n]
  }
  yield %h = %11
  output %11
)"),
            cell(R"(  step {
    %0 = const {value = 2} : []
    %1 = const {value = 3} : []
    %2 = const {value = 6} : []
    %3 = mul %0, %1 : []
    %4 = const {value = 6} : []
    %5 = const {value = 0} : []
    %6 = sub %2, %4 : []
    %7 = add %x, %5 : [B, n]
    %8 = const {value = 1} : []
    %9 = mul %8, %x : [B, n]
    %10 = neg %x : [B, n]
    %11 = neg %10 : [B, n]
    %12 = concat %x : [B, n]
    %13 = slice %x {offset = 0} : [B, n]
  }
  yield %h = %x
  output %x
)"));
}

TEST(Simplify, KeepsBroadcastingIdentitiesAndMultiplicationByZero) {
  // x * 0 is not 0 for x = inf or NaN; b + 0 with b of shape [n] would change the result shape
  // if the zero were [B, n], but here the zero is a scalar, so that is fine to drop.
  std::string text = cell(R"(  step {
    %0 = const {value = 0} : []
    %1 = mul %x, %0 : [B, n]
    %2 = add %1, %h : [B, n]
  }
  yield %h = %2
  output %2
)");
  checkPass(passes::simplify, text, text, /*expectChanged=*/false);
}

TEST(Simplify, ReadsThePartOfAConcatASliceSelects) {
  checkPass(passes::simplify, cell(R"(  step {
    %0 = concat %x, %h : [B, 2*n]
    %1 = slice %0 {offset = n} : [B, n]
  }
  yield %h = %1
  output %1
)"),
            cell(R"(  step {
    %0 = concat %x, %h : [B, 2*n]
    %1 = slice %0 {offset = n} : [B, n]
  }
  yield %h = %h
  output %h
)"));
}

TEST(Premultiply, HoistsTheInputProjectionAndFoldsBiases) {
  checkPass(passes::premultiply, cell(R"(  step {
    %0 = linear %x, %w : [B, n]
    %1 = add %0, %b : [B, n]
    %2 = linear %h, %u : [B, n]
    %3 = add %2, %c : [B, n]
    %4 = add %1, %3 : [B, n]
    %5 = tanh %4 : [B, n]
  }
  yield %h = %5
  output %5
)"),
            cell(R"(  pre {
    %0 = linear %x, %w : [B, n]
    %1 = add %b, %c : [n]
    %2 = add %0, %1 : [B, n]
  }
  step {
    %3 = linear %h, %u : [B, n]
    %4 = add %3, %2 : [B, n]
    %5 = tanh %4 : [B, n]
  }
  yield %h = %5
  output %5
)"));
}

// A GRU's gates read both products through slices of biased sums, chunk(linear(x, W, b)) and
// chunk(linear(h, U, c)). Where a gate adds the two, the recurrent bias's slice joins the input
// side and the two bias slices become one vector; where it is multiplied first (n = tanh(xn +
// r * hn)), it stays in the loop.
TEST(Premultiply, FoldsTheBiasesOfChunkedProductsIntoTheInputSide) {
  const std::string header = R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %w : [2*n, n]
  param %u : [2*n, n]
  param %b : [2*n]
  param %c : [2*n]
)";
  const std::string input = header + R"(  step {
    %0 = linear %x, %w : [B, 2*n]
    %1 = add %0, %b : [B, 2*n]
    %2 = linear %h, %u : [B, 2*n]
    %3 = add %2, %c : [B, 2*n]
    %4 = slice %1 {offset = 0} : [B, n]
    %5 = slice %3 {offset = 0} : [B, n]
    %6 = add %4, %5 : [B, n]
    %7 = sigmoid %6 : [B, n]
    %8 = slice %1 {offset = n} : [B, n]
    %9 = slice %3 {offset = n} : [B, n]
    %10 = mul %7, %9 : [B, n]
    %11 = add %8, %10 : [B, n]
    %12 = tanh %11 : [B, n]
  }
  yield %h = %12
  output %12
}
)";
  const std::string folded = header + R"(  pre {
    %0 = linear %x, %w : [B, 2*n]
    %1 = slice %0 {offset = 0} : [B, n]
    %2 = slice %b {offset = 0} : [n]
    %3 = slice %c {offset = 0} : [n]
    %4 = add %2, %3 : [n]
    %5 = add %1, %4 : [B, n]
    %6 = slice %0 {offset = n} : [B, n]
    %7 = slice %b {offset = n} : [n]
    %8 = add %6, %7 : [B, n]
  }
  step {
    %9 = linear %h, %u : [B, 2*n]
    %10 = add %9, %c : [B, 2*n]
    %11 = slice %9 {offset = 0} : [B, n]
    %12 = add %11, %5 : [B, n]
    %13 = sigmoid %12 : [B, n]
    %14 = slice %10 {offset = n} : [B, n]
    %15 = mul %13, %14 : [B, n]
    %16 = add %8, %15 : [B, n]
    %17 = tanh %16 : [B, n]
  }
  yield %h = %17
  output %17
}
)";
  checkPass(passes::premultiply, input, folded);
  checkPass(passes::premultiply, folded, folded, /*expectChanged=*/false);
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

// What a hoisted product reads (a layer norm of the input) leaves the loop with it, and so does
// what reads only hoisted values and parameters (the product's bias); a row-wise op on the inputs
// that no hoisted product needs stays in the loop, where its result never becomes an array over
// all steps.
TEST(Premultiply, HoistsProductsWithWhatTheyReadAndLeavesOtherRowWiseWork) {
  std::string text = cell(R"(  pre {
    %0 = linear %x, %w : [B, n]
  }
  step {
    %1 = linear %h, %u : [B, n]
    %2 = add %1, %0 : [B, n]
    %3 = layernorm %x {eps = 1e-05} : [B, n]
    %4 = linear %3, %w : [B, n]
    %5 = add %4, %b : [B, n]
    %6 = sigmoid %x : [B, n]
    %7 = mul %2, %6 : [B, n]
    %8 = add %7, %5 : [B, n]
  }
  yield %h = %8
  output %8
)");
  std::string expected = cell(R"(  pre {
    %0 = linear %x, %w : [B, n]
    %1 = layernorm %x {eps = 1e-05} : [B, n]
    %2 = linear %1, %w : [B, n]
    %3 = add %2, %b : [B, n]
  }
  step {
    %4 = linear %h, %u : [B, n]
    %5 = add %4, %0 : [B, n]
    %6 = sigmoid %x : [B, n]
    %7 = mul %5, %6 : [B, n]
    %8 = add %7, %3 : [B, n]
  }
  yield %h = %8
  output %8
)");
  checkPass(passes::premultiply, text, expected);
  checkPass(passes::premultiply, expected, expected, /*expectChanged=*/false);
}

TEST(SinkSlices, SplitsElementwiseWorkIntoTheSlicesThatUseIt) {
  checkPass(passes::sinkSlices, R"(cell @t(n) {
  input %x : [B, 2*n]
  state %h : [B, n]
  param %b : [2*n]
  step {
    %0 = add %x, %b : [B, 2*n]
    %1 = const {value = 2} : []
    %2 = mul %0, %1 : [B, 2*n]
    %3 = slice %2 {offset = 0} : [B, n]
    %4 = slice %2 {offset = n} : [B, n]
    %5 = slice %4 {offset = 0} : [B, n]
    %6 = add %3, %5 : [B, n]
  }
  yield %h = %6
  output %6
}
)",
            R"(cell @t(n) {
  input %x : [B, 2*n]
  state %h : [B, n]
  param %b : [2*n]
  step {
    %0 = const {value = 2} : []
    %1 = slice %x {offset = 0} : [B, n]
    %2 = slice %b {offset = 0} : [n]
    %3 = add %1, %2 : [B, n]
    %4 = mul %3, %0 : [B, n]
    %5 = slice %x {offset = n} : [B, n]
    %6 = slice %b {offset = n} : [n]
    %7 = add %5, %6 : [B, n]
    %8 = mul %7, %0 : [B, n]
    %9 = add %4, %8 : [B, n]
  }
  yield %h = %9
  output %9
}
)");
}

TEST(SinkSlices, LeavesValuesWithOtherUsesAndPreValuesAlone) {
  std::string text = cell(R"(  pre {
    %0 = add %x, %b : [B, n]
  }
  step {
    %1 = add %x, %h : [B, n]
    %2 = slice %1 {offset = 0} : [B, n]
    %3 = slice %0 {offset = 0} : [B, n]
    %4 = add %2, %3 : [B, n]
    %5 = add %4, %1 : [B, n]
  }
  yield %h = %5
  output %5
)");
  checkPass(passes::sinkSlices, text, text, /*expectChanged=*/false);
}

TEST(Fuse, GroupsElementwiseRunsAroundMatrixProducts) {
  checkPass(passes::fuseElementwise, cell(R"(  step {
    %0 = const {value = 1} : []
    %1 = add %b, %c : [n]
    %2 = linear %h, %u : [B, n]
    %3 = add %2, %1 : [B, n]
    %4 = linear %x, %w : [B, n]
    %5 = sub %0, %3 : [B, n]
    %6 = sigmoid %5 : [B, n]
    %7 = layernorm %6 {eps = 1e-05} : [B, n]
    %8 = tanh %7 : [B, n]
    %9 = add %8, %4 : [B, n]
  }
  yield %h = %9
  output %6
)"),
            cell(R"(  step {
    %0 = linear %h, %u : [B, n]
    %1 = linear %x, %w : [B, n]
    %2 = const {value = 1} : []
    fused {
      %3 = add %b, %c : [n]
      %4 = add %0, %3 : [B, n]
      %5 = sub %2, %4 : [B, n]
      %6 = sigmoid %5 : [B, n]
    }
    %7 = layernorm %6 {eps = 1e-05} : [B, n]
    fused {
      %8 = tanh %7 : [B, n]
      %9 = add %8, %1 : [B, n]
    }
  }
  yield %h = %9
  output %6
)"));
}

TEST(Fuse, ALayerNormOfAProductJoinsTheKernelThatSlicesIt) {
  checkPass(passes::fuseElementwise, R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %u : [2*n, n]
  param %g : [2*n]
  step {
    %0 = linear %h, %u : [B, 2*n]
    %1 = layernorm %0 {eps = 1e-05} : [B, 2*n]
    %2 = slice %1 {offset = 0} : [B, n]
    %3 = slice %1 {offset = n} : [B, n]
    %4 = slice %g {offset = n} : [n]
    %5 = mul %3, %4 : [B, n]
    %6 = sigmoid %2 : [B, n]
    %7 = add %5, %6 : [B, n]
    %8 = add %7, %x : [B, n]
  }
  yield %h = %8
  output %8
}
)",
            R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %u : [2*n, n]
  param %g : [2*n]
  step {
    %0 = linear %h, %u : [B, 2*n]
    fused {
      %1 = layernorm %0 {eps = 1e-05} : [B, 2*n]
      %2 = slice %1 {offset = 0} : [B, n]
      %3 = slice %1 {offset = n} : [B, n]
      %4 = slice %g {offset = n} : [n]
      %5 = mul %3, %4 : [B, n]
      %6 = sigmoid %2 : [B, n]
      %7 = add %5, %6 : [B, n]
      %8 = add %7, %x : [B, n]
    }
  }
  yield %h = %8
  output %8
}
)");
}

TEST(Fuse, ALayerNormWhoseValuesEscapeStaysARowWiseCall) {
  // %2 is the output: a fused norm has no storage, so this one is computed on its own.
  checkPass(passes::fuseElementwise, cell(R"(  step {
    %0 = add %x, %h : [B, n]
    %1 = linear %h, %u : [B, n]
    %2 = layernorm %1 {eps = 1e-05} : [B, n]
    %3 = tanh %2 : [B, n]
    %4 = layernorm %0 {eps = 1e-05} : [B, n]
  }
  yield %h = %3
  output %2
)"),
            cell(R"(  step {
    %0 = linear %h, %u : [B, n]
    %1 = layernorm %0 {eps = 1e-05} : [B, n]
    fused {
      %2 = add %x, %h : [B, n]
    }
    %3 = layernorm %2 {eps = 1e-05} : [B, n]
    fused {
      %4 = tanh %1 : [B, n]
    }
  }
  yield %h = %4
  output %1
)"));
}

TEST(Fuse, AValueWithoutBatchThatEscapesIsComputedOnItsOwn) {
  // %1 is read by the step: inside the [B, n] kernel it would be stored from every row, into
  // storage that the generated code fills once per set of parameters.
  checkPass(passes::fuseElementwise, R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %b : [n]
  param %w : [n, n]
  pre {
    %0 = const {value = 2} : []
    %1 = add %x, %b : [B, n]
    %2 = mul %b, %0 : [n]
    %3 = add %1, %2 : [B, n]
  }
  step {
    %4 = linear %h, %w : [B, n]
    %5 = add %3, %4 : [B, n]
    %6 = mul %5, %2 : [B, n]
  }
  yield %h = %6
  output %6
}
)",
            R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %b : [n]
  param %w : [n, n]
  pre {
    %0 = const {value = 2} : []
    %1 = mul %b, %0 : [n]
    fused {
      %2 = add %x, %b : [B, n]
      %3 = add %2, %1 : [B, n]
    }
  }
  step {
    %4 = linear %h, %w : [B, n]
    fused {
      %5 = add %3, %4 : [B, n]
      %6 = mul %5, %1 : [B, n]
    }
  }
  yield %h = %6
  output %6
}
)");
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

TEST(FuseMatMul, TheProductJoinsTheKernelThatSlicesIt) {
  checkPass(passes::fuseMatMul, R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %u : [2*n, n]
  param %b : [n]
  step {
    %0 = linear %h, %u : [B, 2*n]
    %1 = linear %x, %u : [B, 2*n]
    fused {
      %2 = slice %0 {offset = 0} : [B, n]
      %3 = slice %0 {offset = n} : [B, n]
      %4 = slice %1 {offset = n} : [B, n]
      %5 = sigmoid %2 : [B, n]
      %6 = mul %5, %3 : [B, n]
      %7 = add %6, %4 : [B, n]
      %8 = add %7, %b : [B, n]
    }
  }
  yield %h = %8
  output %8
}
)",
            R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %u : [2*n, n]
  param %b : [n]
  step {
    %0 = linear %x, %u : [B, 2*n]
    fused {
      %1 = linear %h, %u : [B, 2*n]
      %2 = slice %1 {offset = 0} : [B, n]
      %3 = slice %1 {offset = n} : [B, n]
      %4 = slice %0 {offset = n} : [B, n]
      %5 = sigmoid %2 : [B, n]
      %6 = mul %5, %3 : [B, n]
      %7 = add %6, %4 : [B, n]
      %8 = add %7, %b : [B, n]
    }
  }
  yield %h = %8
  output %8
}
)");
}

// A vanilla RNN's kernel reads its product whole: it reads it through one slice of every
// column instead, and the product joins the kernel. A kernel that already leads with a product
// does not take a second (the no-premultiply RNN's input product stays a GEMM), and a kernel
// that normalises rows takes none (the whole-row read stays as it was).
TEST(FuseMatMul, TheInputProjectionJoinsTheKernelThatAddsItsBiases) {
  // In the pre block: the kernel adds the summed biases to each tile of the product, so the
  // [T*B, 2n] product itself is never stored.
  checkPass(passes::fuseMatMul, R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %w : [2*n, n]
  param %b : [2*n]
  param %c : [2*n]
  pre {
    %0 = linear %x, %w : [B, 2*n]
    fused {
      %1 = add %b, %c : [2*n]
      %2 = add %0, %1 : [B, 2*n]
    }
  }
  step {
    fused {
      %3 = slice %2 {offset = 0} : [B, n]
      %4 = add %3, %h : [B, n]
    }
  }
  yield %h = %4
  output %4
}
)",
            R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %w : [2*n, n]
  param %b : [2*n]
  param %c : [2*n]
  pre {
    fused {
      %0 = linear %x, %w : [B, 2*n]
      %1 = add %b, %c : [2*n]
      %2 = slice %0 {offset = 0} : [B, 2*n]
      %3 = add %2, %1 : [B, 2*n]
    }
  }
  step {
    fused {
      %4 = slice %3 {offset = 0} : [B, n]
      %5 = add %4, %h : [B, n]
    }
  }
  yield %h = %5
  output %5
}
)");
}

TEST(FuseMatMul, AProductWhoseSlicesAreReadOutsideTheirKernelStaysApart) {
  // chunk(x @ w^T, 2) read raw by the step: the pre kernel holds only the slices, which the step
  // reads; fused, the product would have no storage, and so neither would its slices.
  const std::string rawChunks = R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %w : [2*n, n]
  pre {
    %0 = linear %x, %w : [B, 2*n]
    fused {
      %1 = slice %0 {offset = 0} : [B, n]
      %2 = slice %0 {offset = n} : [B, n]
    }
  }
  step {
    fused {
      %3 = add %1, %h : [B, n]
      %4 = tanh %3 : [B, n]
      %5 = mul %4, %2 : [B, n]
    }
  }
  yield %h = %5
  output %5
}
)";
  checkPass(passes::fuseMatMul, rawChunks, rawChunks, /*expectChanged=*/false);
}

TEST(FuseMatMul, AProductReadWholeJoinsItsKernelThroughOneSlice) {
  checkPass(passes::fuseMatMul, R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %u : [n, n]
  param %w : [n, n]
  step {
    %0 = linear %h, %u : [B, n]
    %1 = linear %x, %w : [B, n]
    fused {
      %2 = add %0, %1 : [B, n]
      %3 = tanh %2 : [B, n]
    }
  }
  yield %h = %3
  output %3
}
)",
            R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %u : [n, n]
  param %w : [n, n]
  step {
    %0 = linear %x, %w : [B, n]
    fused {
      %1 = linear %h, %u : [B, n]
      %2 = slice %1 {offset = 0} : [B, n]
      %3 = add %2, %0 : [B, n]
      %4 = tanh %3 : [B, n]
    }
  }
  yield %h = %4
  output %4
}
)");
  const char* normalised = R"(cell @t(n) {
  state %h : [B, n]
  param %u : [n, n]
  step {
    %0 = linear %h, %u : [B, n]
    fused {
      %1 = layernorm %0 {eps = 1e-05} : [B, n]
      %2 = tanh %1 : [B, n]
    }
  }
  yield %h = %2
  output %2
}
)";
  checkPass(passes::fuseMatMul, normalised, normalised, /*expectChanged=*/false);
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
  int fusion = 0, premultiply = 0;
  for (const passes::Pass& pass : passes::allPasses()) {
    EXPECT_TRUE(names.insert(pass.name).second) << pass.name << " is listed twice";
    fusion += pass.group == passes::PassGroup::Fusion;
    premultiply += pass.group == passes::PassGroup::Premultiply;
  }
  EXPECT_EQ(fusion, 3);
  EXPECT_EQ(premultiply, 1);
  passes::PipelineOptions noFuse, noPremul, oneCse;
  noFuse.fuse = false;
  noPremul.premultiply = false;
  oneCse.disabled = {"premultiply-cse"};
  const size_t all = passes::allPasses().size();
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

TEST(PassManager, NoPremulKeepsEverythingInTheLoop) {
  auto lstm = frontend::loadCell("lstm");
  passes::PipelineOptions options;
  options.premultiply = false;
  std::ostringstream log;
  passes::runPipeline(*lstm, options, log);
  EXPECT_TRUE(lstm->pre.empty());
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

TEST(MergeGates, StacksWeightsAndSlicesTheMergedProduct) {
  checkPass(passes::mergeGates, cell(R"(  step {
    %0 = linear %h, %w : [B, n]
    %1 = tanh %0 : [B, n]
    %2 = linear %h, %u : [B, n]
    %3 = linear %x, %w : [B, n]
    %4 = add %1, %2 : [B, n]
    %5 = add %4, %3 : [B, n]
  }
  yield %h = %5
  output %5
)"),
            cell(R"(  pre {
    %0 = stack %w, %u : [2*n, n]
  }
  step {
    %1 = linear %h, %0 : [B, 2*n]
    %2 = slice %1 {offset = 0} : [B, n]
    %3 = slice %1 {offset = n} : [B, n]
    %4 = tanh %2 : [B, n]
    %5 = linear %x, %w : [B, n]
    %6 = add %4, %3 : [B, n]
    %7 = add %6, %5 : [B, n]
  }
  yield %h = %7
  output %7
)"));
}

} // namespace

// The IR's printer, parser and verifier: round trips of every built-in cell, and malformed IR
// rejected with a located message.
#include "frontend/BuiltinCells.h"
#include "frontend/CellParser.h"
#include "ir/Builder.h"
#include "ir/Error.h"
#include "ir/IRParser.h"
#include "ir/Printer.h"
#include "ir/ShapeInference.h"
#include "ir/ValueMap.h"
#include "ir/Verifier.h"
#include "passes/Autodiff.h"

#include <gtest/gtest.h>

using namespace rnnc;

namespace {

// Expects `body` to throw UserError whose message contains `expected`.
template <class F> void expectUserError(F&& body, const std::string& expected) {
  try {
    body();
    FAIL() << "expected an error containing: " << expected;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << expected;
  }
}

class BuiltinRoundTrip : public testing::TestWithParam<std::string> {};

TEST_P(BuiltinRoundTrip, PrintParsePrintIsStable) {
  auto cell = frontend::loadCell(GetParam());
  std::string printed = ir::toString(*cell);
  auto reparsed = ir::parseIR(printed, "<roundtrip>");
  EXPECT_EQ(ir::toString(*reparsed), printed);
}

TEST_P(BuiltinRoundTrip, BoundSizesRoundTripToo) {
  auto cell = frontend::loadCell(GetParam());
  ir::SizeMap sizes;
  for (const auto& name : cell->sizeNames)
    sizes[name] = 3 + static_cast<int64_t>(sizes.size());
  cell->bindSizes(sizes);
  ir::verify(*cell);
  std::string printed = ir::toString(*cell);
  EXPECT_EQ(printed.find("hidden_size]"), std::string::npos) << printed;
  EXPECT_EQ(ir::toString(*ir::parseIR(printed)), printed);
}

TEST_P(BuiltinRoundTrip, CloneIsIdentical) {
  auto cell = frontend::loadCell(GetParam());
  EXPECT_EQ(ir::toString(*cell->clone()), ir::toString(*cell));
}

INSTANTIATE_TEST_SUITE_P(AllBuiltins, BuiltinRoundTrip,
                         testing::ValuesIn(frontend::builtinCellNames()),
                         [](const auto& info) { return info.param; });

TEST(Builtins, AreTheDocumentedSet) {
  EXPECT_EQ(frontend::builtinCellNames(),
            (std::vector<std::string>{"gru", "lnlstm", "lstm", "lstm_proj", "peephole_lstm",
                                      "rnn_relu", "rnn_tanh"}));
}

// A small cell in IR text with a pre block, used as the base for malformed variants.
const char* kValidIR = R"(cell @tiny(hidden_size) {
  input %x : [B, hidden_size]
  state %h : [B, hidden_size]
  param %w : [hidden_size, hidden_size]
  param %b : [hidden_size]
  pre {
    %0 = linear %x, %w : [B, hidden_size]
  }
  step {
    %1 = add %0, %h : [B, hidden_size]
    %2 = add %1, %b : [B, hidden_size]
    %3 = clamp %2 {lo = -1, hi = 1.5} : [B, hidden_size]
    %4 = layernorm %3 {eps = 1e-05} : [B, hidden_size]
    %5 = dropout %4 {p = 0.25} : [B, hidden_size]
    %6 = const {value = 0.5} : []
    %7 = mul %5, %6 : [B, hidden_size]
    %8 = concat %7, %h : [B, 2*hidden_size]
    %9 = slice %8 {offset = hidden_size} : [B, hidden_size]
  }
  yield %h = %9
  output %7
}
)";

// An LSTM step multiplies x [B, I] by W_ih [4H, I] and h [B, H] by W_hh [4H, H]: 2 * B * 4H *
// (I + H) FLOP, whether both products sit in the step or the input's in the pre block.
TEST(MatrixProductFlops, CountsEveryProductOfAStepAtTheBatchGiven) {
  auto cell = frontend::loadCell("lstm");
  cell->bindSizes({{"input_size", 3}, {"hidden_size", 5}});
  EXPECT_DOUBLE_EQ(ir::matrixProductFlopsPerStep(*cell, 2), 2.0 * 2 * 20 * (3 + 5));
  EXPECT_DOUBLE_EQ(ir::matrixProductFlopsPerStep(*cell, 7), 2.0 * 7 * 20 * (3 + 5));
  // Unbound sizes count nothing rather than guess.
  EXPECT_DOUBLE_EQ(ir::matrixProductFlopsPerStep(*frontend::loadCell("lstm"), 2), 0.0);
  // A cell without products does no matrix-product work.
  auto plain = frontend::parseCell("cell c(n) {\n  input x[n]\n  state h[n]\n"
                                   "  h2 = tanh(x + h)\n  return h = h2; output h2\n}\n",
                                   "plain.cell");
  plain->bindSizes({{"n", 4}});
  EXPECT_DOUBLE_EQ(ir::matrixProductFlopsPerStep(*plain, 3), 0.0);
}

// The passes' per-value map: entries default-inserted, found again after the table grew many
// times over, values it never saw absent; at() of an absent value is an internal error.
TEST(ValueMap, FindsEveryValueAfterGrowingAndNothingElse) {
  std::vector<ir::Value> values(1000), others(100);
  ir::ValueMap<int> map(4);
  for (size_t i = 0; i < values.size(); ++i)
    map[&values[i]] = static_cast<int>(i) + 1;
  ++map[&values[7]];
  EXPECT_EQ(map.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE(map.contains(&values[i])) << i;
    EXPECT_EQ(*map.find(&values[i]), static_cast<int>(i) + 1 + (i == 7)) << i;
  }
  for (const ir::Value& other : others) {
    EXPECT_FALSE(map.contains(&other));
    EXPECT_EQ(map.find(&other), nullptr);
  }
  EXPECT_THROW(map.at(&others[0]), InternalError);
  // Null marks an empty slot: never found, and no key.
  EXPECT_EQ(map.find(nullptr), nullptr);
  EXPECT_THROW(map[nullptr], InternalError);
  EXPECT_EQ(map[&others[0]], 0); // default-inserted
  EXPECT_EQ(map.size(), values.size() + 1);

  ir::ValueSet set(2);
  EXPECT_TRUE(set.insert(&values[0]));
  EXPECT_TRUE(set.insert(&values[1]));
  EXPECT_FALSE(set.insert(&values[0]));
  EXPECT_FALSE(set.insert(nullptr));
  EXPECT_FALSE(set.contains(nullptr));
  EXPECT_TRUE(set.contains(&values[1]));
  EXPECT_FALSE(set.contains(&values[2]));
  EXPECT_EQ(set.size(), 2u);
}

TEST(IRParser, ReadsEveryAttributeKindAndThePreBlock) {
  auto cell = ir::parseIR(kValidIR);
  EXPECT_EQ(cell->pre.size(), 1u);
  EXPECT_EQ(cell->step.size(), 9u);
  EXPECT_EQ(ir::toString(*cell), kValidIR);
}

std::string replaced(const std::string& from, const std::string& to) {
  std::string text = kValidIR;
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(IRParser, RejectsAWrongWrittenShape) {
  expectUserError(
      [] {
        ir::parseIR(
            replaced("%1 = add %0, %h : [B, hidden_size]", "%1 = add %0, %h : [B, 2*hidden_size]"),
            "t.ir");
      },
      "t.ir:10:23: error: the shape rules give [B, hidden_size] for this add, not "
      "[B, 2*hidden_size]");
}

TEST(IRParser, RejectsUndefinedValues) {
  expectUserError([] { ir::parseIR(replaced("%1 = add %0, %h", "%1 = add %0, %42"), "t.ir"); },
                  "t.ir:10:18: error: use of undefined value '%42'");
}

// Operands in the wrong number are the file's error at the op (a slice without one was an
// internal error in the builder).
TEST(IRParser, RejectsOperandCountsTheOpDoesNotTake) {
  expectUserError([] { ir::parseIR(replaced("= add %0, %h", "= slice {offset = 0}"), "t.ir"); },
                  "t.ir:10:10: error: slice takes one operand, not 0");
  expectUserError([] { ir::parseIR(replaced("= add %0, %h", "= add %0"), "t.ir"); },
                  "t.ir:10:10: error: add takes 2 operand(s), got 1");
}

// Dotted names may have numeric parts: PyTorch's `layers.0.weight`, and the backward cell's
// kept values (`kept.0`), so that `rnnc compile --grad` output parses back.
TEST(IRParser, DottedNamesMayHaveNumericParts) {
  auto backward = passes::deriveBackward(*frontend::loadCell("lstm"));
  std::string text = ir::toString(*backward.cell);
  ASSERT_NE(text.find("%kept.0"), std::string::npos);
  EXPECT_EQ(ir::toString(*ir::parseIR(text, "backward.rnnir")), text);
  auto cell = frontend::parseCell("cell c(n) {\n  input x[n]\n  state h[n]\n"
                                  "  param layers.0.weight[n, n]\n"
                                  "  h2 = tanh(linear(x, layers.0.weight) + h)\n"
                                  "  return h = h2; output h2\n}\n",
                                  "dotted.cell");
  EXPECT_EQ(cell->params[0]->name, "layers.0.weight");
}

TEST(IRParser, RejectsStatesInThePreBlock) {
  expectUserError([] { ir::parseIR(replaced("linear %x, %w", "linear %h, %w"), "t.ir"); },
                  "the pre block cannot use state '%h'");
}

TEST(IRParser, RejectsUnknownOpsAndAttributes) {
  expectUserError([] { ir::parseIR(replaced("= add %0, %h", "= frobnicate %0, %h"), "t.ir"); },
                  "t.ir:10:10: error: unknown op 'frobnicate'");
  expectUserError([] { ir::parseIR(replaced("{lo = -1, hi = 1.5}", "{lo = -1}")); },
                  "clamp needs attribute 'hi'");
  expectUserError([] { ir::parseIR(replaced("{p = 0.25}", "{p = 0.25, q = 1}")); },
                  "dropout has no attribute 'q'");
  expectUserError([] { ir::parseIR(replaced("{p = 0.25}", "{p = 1.5}")); },
                  "dropout: p must be in [0, 1), got 1.5");
}

TEST(IRParser, RejectsRedefinitionsAndBadStructure) {
  expectUserError([] { ir::parseIR(replaced("%2 = add %1, %b", "%1 = add %1, %b")); },
                  "'%1' is defined twice");
  expectUserError([] { ir::parseIR(replaced("  yield %h = %9\n", "")); },
                  "1 state(s) but 0 update(s)");
  expectUserError([] { ir::parseIR(replaced("yield %h = %9", "yield %x = %9")); },
                  "yield assigns states");
  expectUserError([] { ir::parseIR(replaced("output %7", "output %w")); },
                  "the output has shape [hidden_size, hidden_size], expected [B, F]");
  expectUserError([] { ir::parseIR(std::string(kValidIR) + "junk"); },
                  "unexpected 'junk' after the end of the cell");
  expectUserError(
      [] {
        ir::parseIR(replaced("%9 = slice %8 {offset = hidden_size}",
                             "%9 = slice %8 {offset = 2*hidden_size}"));
      },
      "slice: [2*hidden_size : 3*hidden_size] is not within the last dimension");
}

// The size list, read by the same function as the cell language's header (ir::parseSizeList),
// with the values only the IR gives.
TEST(IRParser, ReadsSizeValuesAndRejectsBadSizeLists) {
  auto bound = ir::parseIR(replaced("cell @tiny(hidden_size)", "cell @tiny(hidden_size = 4)"));
  EXPECT_EQ(bound->sizes.at("hidden_size"), 4);
  EXPECT_EQ(bound->sizeNames, (std::vector<std::string>{"hidden_size"}));
  expectUserError(
      [] {
        ir::parseIR(replaced("cell @tiny(hidden_size)", "cell @tiny(hidden_size = 0)"), "t.ir");
      },
      "t.ir:1:26: error: size value must be a positive integer");
  expectUserError(
      [] {
        ir::parseIR(replaced("cell @tiny(hidden_size)", "cell @tiny(hidden_size, B)"), "t.ir");
      },
      "t.ir:1:25: error: 'B' is the batch size, always present; it cannot be declared");
  expectUserError(
      [] {
        ir::parseIR(replaced("cell @tiny(hidden_size)", "cell @tiny(hidden_size, hidden_size)"),
                    "t.ir");
      },
      "t.ir:1:25: error: size 'hidden_size' is declared twice");
}

TEST(IRParser, RejectsUnknownSizes) {
  expectUserError(
      [] { ir::parseIR(replaced("param %b : [hidden_size]", "param %b : [width]"), "t.ir"); },
      "t.ir:5:15: error: unknown size 'width'");
}

// The verifier must catch what a buggy pass could leave behind, and print the IR with it.
TEST(Verifier, CatchesUseBeforeDefinition) {
  auto cell = ir::parseIR(kValidIR);
  std::swap(cell->step[0], cell->step[1]);
  expectUserError([&] { ir::verify(*cell); }, "add uses a value that is not defined before it");
}

TEST(Verifier, CatchesAStaleShapeAndPrintsTheIR) {
  auto cell = ir::parseIR(kValidIR);
  cell->step[0]->result.shape = {ir::Dim::symbol("B"), ir::Dim::constant(7)};
  expectUserError([&] { ir::verify(*cell); },
                  "add has shape [B, 7] but its operands give [B, hidden_size]");
  expectUserError([&] { ir::verify(*cell); }, "cell @tiny(hidden_size) {");
}

TEST(Verifier, CatchesStepValuesInThePreBlock) {
  auto cell = ir::parseIR(kValidIR);
  cell->pre[0]->operands[0] = &cell->step[0]->result;
  expectUserError([&] { ir::verify(*cell); }, "uses a value that is not defined before it");
}

TEST(Verifier, CatchesAnUpdateOfTheWrongShape) {
  auto cell = ir::parseIR(kValidIR);
  cell->updates[0].next = &cell->step.back()->operands[0]->def->result; // the concat
  expectUserError([&] { ir::verify(*cell); },
                  "state '%h' has shape [B, hidden_size] but its update has shape "
                  "[B, 2*hidden_size]");
}

TEST(Verifier, CatchesDuplicateArgumentNames) {
  auto cell = ir::parseIR(kValidIR);
  cell->params[1]->name = "w";
  expectUserError([&] { ir::verify(*cell); }, "argument name '%w' is used twice");
}

TEST(Verifier, CatchesASliceOfAFusedProductReadOutsideItsKernel) {
  // The raw chunks of a premultiplied product, read by the step: fused into the pre kernel, the
  // product has no storage, and neither have its slices (what fuse-matmul must not make).
  const char* text = R"(cell @t(n) {
  input %x : [B, n]
  state %h : [B, n]
  param %w : [2*n, n]
  pre {
    fused {
      %0 = linear %x, %w : [B, 2*n]
      %1 = slice %0 {offset = 0} : [B, n]
      %2 = slice %0 {offset = n} : [B, n]
    }
  }
  step {
    fused {
      %3 = add %1, %h : [B, n]
      %4 = mul %3, %2 : [B, n]
    }
  }
  yield %h = %4
  output %4
}
)";
  expectUserError([&] { ir::parseIR(text, "t.ir"); },
                  "a slice of the linear fused into kernel 0 is read by a add outside the kernel");
}

TEST(Verifier, CatchesAValueFromAnotherCell) {
  auto cell = ir::parseIR(kValidIR);
  auto other = ir::parseIR(kValidIR);
  cell->step[0]->operands[1] = other->states[0].get();
  expectUserError([&] { ir::verify(*cell); }, "not defined before it");
}

TEST(Builder, ChecksShapesWhenANodeIsMade) {
  auto cell = ir::parseIR(kValidIR);
  ir::Builder builder(*cell, cell->step);
  EXPECT_THROW(builder.create(ir::Op::Add, {cell->params[0].get(), cell->inputs[0].get()}),
               ir::ShapeError);
  EXPECT_THROW(builder.create(ir::Op::Sigmoid, {}), ir::ShapeError);
  ir::Value* sum = builder.create(ir::Op::Add, {cell->inputs[0].get(), cell->params[1].get()});
  EXPECT_EQ(ir::shapeStr(sum->shape), "[B, hidden_size]");
}

TEST(Cell, BindSizesRejectsUnknownAndNonPositiveSizes) {
  auto cell = ir::parseIR(kValidIR);
  expectUserError([&] { cell->bindSizes({{"width", 3}}); },
                  "cell 'tiny' has no size named 'width' (its sizes: hidden_size)");
  expectUserError([&] { cell->bindSizes({{"hidden_size", 0}}); },
                  "size 'hidden_size' must be positive");
}

TEST(Cell, ReplaceAllUsesReachesOperandsUpdatesAndOutput) {
  auto cell = ir::parseIR(kValidIR);
  ir::Value* h = cell->states[0].get();
  ir::Value* x = cell->inputs[0].get();
  int before = ir::countUses(*cell, h);
  EXPECT_EQ(before, 2);
  ir::replaceAllUses(*cell, h, x);
  EXPECT_EQ(ir::countUses(*cell, h), 0);
  EXPECT_EQ(ir::countUses(*cell, x), before + 1);
}

} // namespace

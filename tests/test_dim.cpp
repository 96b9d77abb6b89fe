#include "ir/Dim.h"
#include "ir/DimParser.h"

#include <gtest/gtest.h>

using rnnc::ir::Dim;

namespace {

Dim parse(const std::string& text) {
  rnnc::Lexer lexer(text, "<dim>");
  return rnnc::ir::parseDim(lexer, nullptr);
}

TEST(Dim, PrintsCanonicalLinearForms) {
  EXPECT_EQ(Dim::constant(512).str(), "512");
  EXPECT_EQ(Dim::symbol("hidden_size", 4).str(), "4*hidden_size");
  EXPECT_EQ((Dim::symbol("input_size") + Dim::symbol("hidden_size")).str(),
            "hidden_size + input_size");
  EXPECT_EQ((Dim::symbol("h") * 2 - Dim::constant(3)).str(), "2*h - 3");
  EXPECT_EQ((Dim::symbol("h") - Dim::symbol("h")).str(), "0");
  EXPECT_EQ((Dim::constant(0) - Dim::symbol("h")).str(), "-h");
}

TEST(Dim, ParsesWhatItPrints) {
  for (const char* text : {"4*hidden_size", "hidden_size + input_size", "2*h - 3", "B", "7"})
    EXPECT_EQ(parse(text).str(), text);
  EXPECT_EQ(parse("hidden_size*4").str(), "4*hidden_size");
  EXPECT_EQ(parse("2*(h + 1)").str(), "2*h + 2");
}

TEST(Dim, RejectsNonLinearProducts) {
  try {
    parse("hidden_size*input_size");
    FAIL() << "expected an error";
  } catch (const rnnc::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("<dim>:1:12: error: dimensions must be linear"),
              std::string::npos)
        << e.what();
  }
}

TEST(Dim, SubstitutesAndEvaluates) {
  Dim d = parse("4*hidden_size + input_size");
  EXPECT_EQ(d.substitute({{"hidden_size", 3}}).str(), "input_size + 12");
  EXPECT_EQ(d.evaluate({{"hidden_size", 3}, {"input_size", 5}}), 17);
  EXPECT_FALSE(d.evaluate({{"hidden_size", 3}}).has_value());
}

TEST(Dim, DividesExactlyOrNotAtAll) {
  EXPECT_EQ(parse("4*h").exactlyDividedBy(4), Dim::symbol("h"));
  EXPECT_FALSE(parse("h").exactlyDividedBy(4).has_value());
  EXPECT_FALSE(parse("4*h + 2").exactlyDividedBy(4).has_value());
}

TEST(Dim, ProvesSignOnlyWhenItHoldsForAllPositiveSizes) {
  EXPECT_TRUE(parse("h").isProvablyPositive());
  EXPECT_TRUE(parse("2*h - 0").isProvablyNonNegative());
  EXPECT_FALSE(parse("h - 1").isProvablyNonNegative());
  EXPECT_FALSE(parse("0").isProvablyPositive());
}

} // namespace

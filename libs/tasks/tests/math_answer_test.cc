#include "libs/tasks/math_answer.h"

#include "gtest/gtest.h"

namespace rlfleet::tasks {
namespace {

std::string Extract(absl::string_view response, const std::string& how) {
  auto a = ExtractMathAnswer(response);
  if (!a.has_value()) return "<none>";
  EXPECT_EQ(a->how, how) << response;
  return a->text;
}

TEST(MathAnswer, TheStatedAnswerIsTheLastBoxElseGsm8kElseTheLastNumber) {
  EXPECT_EQ(Extract("so x = \\boxed{12} but \\boxed{\\frac{1}{2}} at last.", "boxed"), "\\frac{1}{2}");
  EXPECT_EQ(Extract("the set is \\boxed{ \\{1, 2\\} }", "boxed"), "\\{1, 2\\}");
  EXPECT_EQ(Extract("She sold 48 + 24 = 72 clips.\n#### 72", "gsm8k"), "72");
  EXPECT_EQ(Extract("#### 1,000\nmore text 5", "gsm8k"), "1,000");
  EXPECT_EQ(Extract("3 apples and 4.5 pears cost -1,234.50 in total", "last_number"), "-1,234.50");
  EXPECT_EQ(Extract("the answer is .5", "last_number"), ".5");
  EXPECT_EQ(Extract("list: 1,2,3", "last_number"), "3");  // (not a thousands comma)
  EXPECT_EQ(Extract("no numbers here", ""), "<none>");
  EXPECT_EQ(Extract("an unclosed \\boxed{12 and 7", "last_number"), "7");
}

TEST(MathAnswer, MatchesByNormalFormOrNumberWithinTolerance) {
  EXPECT_TRUE(MathAnswersMatch("1,234", "1234"));
  EXPECT_TRUE(MathAnswersMatch("$1234.$", "1234"));
  EXPECT_TRUE(MathAnswersMatch("\\dfrac{1}{2}", "\\frac{1}{2}"));
  EXPECT_TRUE(MathAnswersMatch("\\frac{1}{2}", "0.5"));
  EXPECT_TRUE(MathAnswersMatch("3/4", "0.75"));
  EXPECT_TRUE(MathAnswersMatch("72.0", "72"));
  EXPECT_TRUE(MathAnswersMatch("50%", "50"));
  EXPECT_TRUE(MathAnswersMatch("5 \\text{cm}", "5cm"));
  EXPECT_TRUE(MathAnswersMatch("0.3333334", "0.3333333", 1e-6));
  EXPECT_FALSE(MathAnswersMatch("0.3334", "0.3333", 1e-6));
  EXPECT_FALSE(MathAnswersMatch("72", "27"));
  EXPECT_FALSE(MathAnswersMatch("inf", "1e400"));
  EXPECT_FALSE(MathAnswersMatch("1/0", "1/0.0"));  // (no value; the normal forms differ)
  EXPECT_EQ(MathAnswerValue("-\\frac{3}{4}"), -0.75);
  EXPECT_EQ(MathAnswerValue("x+1"), std::nullopt);
}

}  // namespace
}  // namespace rlfleet::tasks

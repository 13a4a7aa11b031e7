#include "libs/tasks/tasks.h"

#include "absl/random/random.h"
#include "gtest/gtest.h"

namespace rlfleet::tasks {
namespace {

TEST(Tasks, SolveMatchesTheKnownAnswers) {
  EXPECT_EQ(*FindTask("reverse")->Solve("reverse:31415"), "51413");
  EXPECT_EQ(*FindTask("sort")->Solve("sort:31415"), "11345");
  EXPECT_EQ(*FindTask("add")->Solve("add:999+1"), "1000");
  EXPECT_EQ(FindTask("nope"), nullptr);
}

TEST(Tasks, MadeExamplesAreConsistentAndWithinLengths) {
  absl::BitGen gen;
  for (const std::string& name : TaskNames()) {
    const Task* task = FindTask(name);
    ASSERT_NE(task, nullptr);
    for (int i = 0; i < 200; ++i) {
      Example e = task->Make(gen, TaskOptions{2, 6});
      auto solved = task->Solve(e.prompt);
      ASSERT_TRUE(solved.ok()) << e.prompt;
      EXPECT_EQ(*solved, e.answer) << e.prompt;
      EXPECT_TRUE(task->WellFormed(e.answer)) << e.answer;
      EXPECT_EQ(task->FinalAnswer(*task->Demonstration(e.prompt)), e.answer) << e.prompt;
      EXPECT_TRUE(task->WellFormed(*task->Demonstration(e.prompt))) << e.prompt;
      if (name == "mul") {
        EXPECT_LE(e.answer.size(), 7u);
      } else if (name != "add") {
        EXPECT_GE(e.answer.size(), 2u);
        EXPECT_LE(e.answer.size(), 6u);
      }
    }
  }
}

TEST(Tasks, MalformedPromptsAreInvalidArgument) {
  EXPECT_EQ(FindTask("reverse")->Solve("sort:123").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FindTask("reverse")->Solve("reverse:12a").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FindTask("add")->Solve("add:1+").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FindTask("add")->Solve("add:1234567890123456789+1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(FindTask("sort")->WellFormed("12 3"));
  EXPECT_TRUE(FindTask("add")->WellFormed("-12"));
}

TEST(Tasks, MulIsAnsweredWithTheCalculator) {
  const Task* mul = FindTask("mul");
  ASSERT_NE(mul, nullptr);
  EXPECT_TRUE(mul->UsesCalculator());
  EXPECT_FALSE(FindTask("reverse")->UsesCalculator());
  EXPECT_EQ(*mul->Solve("mul:37*4"), "148");
  EXPECT_EQ(*mul->Demonstration("mul:37*4"), "[37*4](148)148");
  EXPECT_EQ(mul->FinalAnswer("[37*4](148)148"), "148");
  EXPECT_EQ(mul->FinalAnswer("148"), "148");  // no tool: the whole response
  EXPECT_TRUE(mul->WellFormed("148"));
  EXPECT_TRUE(mul->WellFormed("[1*2](2)[2*2](4)4"));
  EXPECT_FALSE(mul->WellFormed("[37*4]148"));
  EXPECT_FALSE(mul->WellFormed("[37*4](148"));
  EXPECT_FALSE(mul->WellFormed("(148)148"));
  EXPECT_EQ(mul->Solve("mul:37+4").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Calculate("37*4"), "148");
  EXPECT_EQ(Calculate("3+40"), "43");
  EXPECT_EQ(Calculate("3-40"), "-37");
  EXPECT_EQ(Calculate("999999999999999999*2"), std::nullopt);  // past 18 digits
  for (const char* bad : {"", "*", "3*", "*4", "3**4", "a*4", "3*4*5", "34"}) {
    EXPECT_EQ(Calculate(bad), std::nullopt) << bad;
  }
}

}  // namespace
}  // namespace rlfleet::tasks

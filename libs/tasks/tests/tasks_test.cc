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
      if (name != "add") {
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

}  // namespace
}  // namespace rlfleet::tasks

#include "libs/tasks/prompt_dataset.h"

#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace rlfleet::tasks {
namespace {

TEST(PromptDataset, ReadsPromptsOrMessagesAndAnswers) {
  const std::string text =
      "{\"question\": \"What is 2+3?\", \"answer\": \"#### 5\"}\n"
      "\n"
      "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
      "\"7*8?\"}], \"answer\": 56}\n"
      "{\"question\": \"Half of 3?\", \"answer\": 1.5, \"extra\": [1, 2]}\n";
  PromptFields fields;
  fields.prompt = "question";
  auto records = ParsePromptJsonl(text, "d.jsonl", fields);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[0].prompt, "What is 2+3?");
  EXPECT_EQ((*records)[0].answer, "#### 5");
  EXPECT_EQ((*records)[1].line, 3);
  ASSERT_EQ((*records)[1].messages.size(), 2u);
  EXPECT_EQ((*records)[1].messages[1].role, "user");
  EXPECT_EQ((*records)[1].messages[1].content, "7*8?");
  EXPECT_EQ((*records)[1].answer, "56");
  EXPECT_EQ((*records)[2].answer, "1.5");
}

TEST(PromptDataset, BadLinesAreNamedByNumber) {
  auto expect_error = [](const std::string& text, const std::string& needle) {
    auto r = ParsePromptJsonl(text, "d.jsonl");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_TRUE(absl::StrContains(r.status().message(), needle)) << r.status();
  };
  expect_error("{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"b\", \"answer\": \"2\"\n",
               "d.jsonl:2: not a JSON");
  expect_error("[1, 2]\n", "d.jsonl:1: not a JSON object");
  expect_error("{\"text\": \"a\", \"answer\": \"1\"}\n", "d.jsonl:1: has neither `prompt` nor `messages`");
  expect_error("{\"prompt\": 5, \"answer\": \"1\"}\n", "`prompt` is not a string");
  expect_error("{\"prompt\": \"a\"}\n", "has no `answer`");
  expect_error("{\"prompt\": \"a\", \"answer\": null}\n", "`answer` is not a string or a number");
  expect_error("{\"messages\": [{\"role\": \"user\"}], \"answer\": \"1\"}\n", "not a {\"role\"");
  expect_error("\n\n", "no records");
  EXPECT_EQ(ReadPromptJsonl("/nonexistent.jsonl").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadPromptJsonl("/dev/null").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PromptDataset, TheSplitIsASeededShuffleThatLosesNothing) {
  std::string text;
  for (int i = 0; i < 100; ++i) absl::StrAppend(&text, "{\"prompt\": \"p", i, "\", \"answer\": \"", i, "\"}\n");
  auto records = ParsePromptJsonl(text, "d.jsonl");
  ASSERT_TRUE(records.ok());
  PromptSplit a = SplitPrompts(*records, 7, 10), b = SplitPrompts(*records, 7, 10), c = SplitPrompts(*records, 8, 10);
  ASSERT_EQ(a.heldout.size(), 10u);
  ASSERT_EQ(a.train.size(), 90u);
  std::set<std::string> all;
  for (const auto* part : {&a.train, &a.heldout}) {
    for (const auto& r : *part) all.insert(r.prompt);
  }
  EXPECT_EQ(all.size(), 100u);
  std::vector<std::string> order_a, order_b, order_c;
  for (size_t i = 0; i < 10; ++i) {
    order_a.push_back(a.heldout[i].prompt);
    order_b.push_back(b.heldout[i].prompt);
    order_c.push_back(c.heldout[i].prompt);
  }
  EXPECT_EQ(order_a, order_b);
  EXPECT_NE(order_a, order_c);
  // This seed's order is the same on every machine (splitmix64, no std:: distribution).
  EXPECT_EQ(SplitPrompts(*records, 7, 200).heldout.size(), 99u);
}

// A file is read a block at a time; a record past the size limit, or nested too deep,
// is refused naming its line, and the reading stops there.
TEST(PromptDataset, FilesAreStreamedAndOversizedOrDeepRecordsRefusedByLine) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/prompts.jsonl";
  std::string text;
  for (int i = 0; i < 20000; ++i) text += absl::StrCat("{\"prompt\": \"reverse:", i, "\", \"answer\": \"", i, "\"}\n");
  text += "{\"prompt\": \"last, no newline\", \"answer\": 1}";
  {
    std::ofstream out(path, std::ios::binary);
    out << text;
  }
  auto from_file = ReadPromptJsonl(path);
  auto from_text = ParsePromptJsonl(text, path);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  ASSERT_TRUE(from_text.ok()) << from_text.status();
  ASSERT_EQ(from_file->size(), 20001u);
  for (size_t i = 0; i < from_file->size(); ++i) {
    EXPECT_EQ((*from_file)[i].prompt, (*from_text)[i].prompt);
    EXPECT_EQ((*from_file)[i].line, static_cast<int64_t>(i + 1));
  }
  // Line 2 is one record of more than the limit (it never ends: the file is 3x it).
  {
    std::ofstream out(path, std::ios::binary);
    out << "{\"prompt\": \"a\", \"answer\": 1}\n{\"prompt\": \"" << std::string(3 * kMaxPromptRecordBytes, 'x');
  }
  absl::Status s = ReadPromptJsonl(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), ":2: a record of")) << s;
  // Nested 100k deep: refused before it is parsed.
  s = ParsePromptJsonl("{\"prompt\": \"a\", \"answer\": " + std::string(100000, '[') + std::string(100000, ']') + "}",
                       "d.jsonl")
          .status();
  EXPECT_TRUE(absl::StrContains(s.message(), "d.jsonl:1: the record: JSON nested deeper than")) << s;
  // A large unsigned answer is read as it is written.
  auto big = ParsePromptJsonl("{\"prompt\": \"a\", \"answer\": 18446744073709551615}", "d.jsonl");
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ((*big)[0].answer, "18446744073709551615");
}

}  // namespace
}  // namespace rlfleet::tasks

// A run's prompts: the built-in tasks as before, and JSONL datasets through a model
// directory's tokenizer; RunConfig's dataset fields only under the controller's
// --data_root.
#include "services/controller/prompt_source.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/model/hf_tokenizer.h"
#include "libs/tasks/tasks.h"
#include "services/controller/run_loop.h"
#include "services/controller/run_manager.h"

namespace rlfleet::controller {
namespace {

namespace fs = std::filesystem;

std::string TokenizerDir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir, "/", std::getenv("TEST_WORKSPACE"), "/libs/model/testdata/hf/tokenizer_qwen2");
}

std::string WriteDataset(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::ofstream(path) << text;
  return path;
}

TEST(PromptSource, ABuiltInTaskDrawsWhatItDrewBefore) {
  LoopConfig config;
  config.task = "reverse";
  config.held_out = 4;
  auto source = NewPromptSource(config);
  ASSERT_TRUE(source.ok()) << source.status();
  // The held-out set first, then the training prompts, from one generator of the seed.
  absl::BitGen gen(std::seed_seq{config.seed});
  const tasks::Task* task = tasks::FindTask("reverse");
  for (const RunPrompt& p : (*source)->held_out()) EXPECT_EQ(p.text, task->Make(gen, {3, 5}).prompt);
  for (const RunPrompt& p : (*source)->Next(3)) {
    const tasks::Example e = task->Make(gen, {3, 5});
    EXPECT_EQ(p.text, e.prompt);
    EXPECT_EQ(p.answer, e.answer);
    EXPECT_FALSE(p.ids.empty());
  }
  EXPECT_EQ((*source)->task(), "reverse");
}

TEST(PromptSource, ADatasetIsTokenizedSplitAndCycled) {
  std::string text;
  for (int i = 0; i < 20; ++i) {
    absl::StrAppend(&text, "{\"question\": \"What is ", i, " + ", i, "?\", \"solution\": \"#### ", 2 * i, "\"}\n");
  }
  LoopConfig config;
  config.dataset = WriteDataset("sums.jsonl", text);
  config.tokenizer_dir = TokenizerDir();
  config.prompt_field = "question";
  config.answer_field = "solution";
  config.held_out = 5;
  auto source = NewPromptSource(config);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->task(), "math");
  ASSERT_EQ((*source)->held_out().size(), 5u);
  auto tokenizer = model::HfTokenizer::FromFile(config.tokenizer_dir);
  ASSERT_TRUE(tokenizer.ok());
  const RunPrompt& h = (*source)->held_out()[0];
  EXPECT_EQ(h.ids, *(*tokenizer)->Encode(h.text));
  EXPECT_TRUE(absl::StartsWith(h.answer, "#### "));
  // 15 training prompts: a pass gives each once; the next pass again, reshuffled.
  std::vector<RunPrompt> first = (*source)->Next(15), second = (*source)->Next(15);
  std::set<std::string> a, b, held;
  for (const RunPrompt& p : first) a.insert(p.text);
  for (const RunPrompt& p : second) b.insert(p.text);
  for (const RunPrompt& p : (*source)->held_out()) held.insert(p.text);
  EXPECT_EQ(a.size(), 15u);
  EXPECT_EQ(a, b);
  for (const std::string& t : held) EXPECT_EQ(a.count(t), 0u) << "a held-out prompt is trained on: " << t;
  // The same seed, the same prompts.
  auto again = NewPromptSource(config);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->Next(1)[0].text, first[0].text);
  // A response's text leaves special tokens out.
  auto ids = (*tokenizer)->Encode("#### 4<|im_end|>");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*(*source)->Decode(*ids), "#### 4");
}

TEST(PromptSource, DatasetProblemsAreNamed) {
  LoopConfig config;
  config.tokenizer_dir = TokenizerDir();
  config.held_out = 1;
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    config.dataset = WriteDataset("bad.jsonl", text);
    auto source = NewPromptSource(config);
    EXPECT_FALSE(source.ok()) << needle;
    EXPECT_TRUE(absl::StrContains(source.status().message(), needle)) << source.status();
  };
  expect_error("{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"b\"}\n", "bad.jsonl:2: has no `answer`");
  expect_error(
      "{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"b\"}], \"answer\": "
      "\"2\"}\n{\"prompt\": \"c\", \"answer\": \"3\"}\n",
      "chat templates are not supported yet");
  expect_error("{\"prompt\": \"a\", \"answer\": \"1\"}\n", "1 records; held_out 1 needs more");
  config.tokenizer_dir = "/nonexistent";
  expect_error("{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"b\", \"answer\": \"2\"}\n", "tokenizer.json");
}

TEST(PromptSource, ARunsDatasetMustLieUnderTheDataRoot) {
  const std::string root = absl::StrCat(std::getenv("TEST_TMPDIR"), "/data");
  fs::create_directories(root + "/model");
  std::ofstream(root + "/d.jsonl") << "{\"prompt\": \"a\", \"answer\": \"1\"}\n";
  v1::RunConfig run;
  run.set_dataset(root + "/d.jsonl");
  run.set_tokenizer_dir(root + "/model");
  auto refused = LoopConfigFromRun(run, /*data_root=*/"");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "config.dataset")) << refused.status();
  auto loop = LoopConfigFromRun(run, root);
  ASSERT_TRUE(loop.ok()) << loop.status();
  EXPECT_EQ(loop->dataset_task, "math");
  run.set_dataset(root + "/../outside.jsonl");
  EXPECT_TRUE(absl::StrContains(LoopConfigFromRun(run, root).status().message(), "outside")) << "escape refused";
  run.set_dataset("d.jsonl");
  run.set_task("reverse");
  EXPECT_TRUE(absl::StrContains(LoopConfigFromRun(run, root).status().message(), "task")) << "task with dataset";
  v1::RunConfig stray;
  stray.set_tokenizer_dir("x");
  EXPECT_EQ(LoopConfigFromRun(stray, root).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rlfleet::controller

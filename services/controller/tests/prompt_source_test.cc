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
      "records are chat messages: ");
  expect_error("{\"prompt\": \"a\", \"answer\": \"1\"}\n", "1 records; held_out 1 needs more");
  config.tokenizer_dir = "/nonexistent";
  expect_error("{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"b\", \"answer\": \"2\"}\n", "tokenizer.json");
}

// A model directory with the test tokenizer and Qwen2.5's chat template.
std::string ChatModelDir() {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/chat_model");
  fs::create_directories(dir);
  fs::copy_file(TokenizerDir() + "/tokenizer.json", dir + "/tokenizer.json", fs::copy_options::overwrite_existing);
  fs::copy_file(absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                             "/libs/model/testdata/chat/tokenizer_config.json"),
                dir + "/tokenizer_config.json", fs::copy_options::overwrite_existing);
  return dir;
}

TEST(PromptSource, ChatRecordsAndStringsGoThroughTheChatTemplate) {
  const std::string qwen_system =
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
      "assistant.<|im_end|>\n";
  LoopConfig config;
  config.tokenizer_dir = ChatModelDir();
  config.held_out = 1;
  config.dataset = WriteDataset(
      "chat.jsonl",
      "{\"messages\": [{\"role\": \"system\", \"content\": \"Be exact.\"}, {\"role\": \"user\", \"content\": "
      "\"1+1?\"}], \"answer\": \"2\"}\n"
      "{\"prompt\": \"2+2?\", \"answer\": \"4\"}\n");
  auto source = NewPromptSource(config);
  ASSERT_TRUE(source.ok()) << source.status();
  auto tokenizer = model::HfTokenizer::FromFile(config.tokenizer_dir);
  ASSERT_TRUE(tokenizer.ok());
  std::vector<RunPrompt> all = (*source)->held_out();
  for (const RunPrompt& p : (*source)->Next(1)) all.push_back(p);
  ASSERT_EQ(all.size(), 2u);
  int seen = 0;
  for (const RunPrompt& p : all) {
    // Messages: the template's text for them, ending with the assistant's turn. A string
    // without apply_chat_template: as it is.
    if (p.answer == "2") {
      EXPECT_EQ(p.text,
                "<|im_start|>system\nBe exact.<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n"
                "<|im_start|>assistant\n");
    } else {
      EXPECT_EQ(p.text, "2+2?");
    }
    EXPECT_EQ(p.ids, *(*tokenizer)->Encode(p.text));
    ++seen;
  }
  EXPECT_EQ(seen, 2);
  EXPECT_TRUE(absl::StrContains((*source)->Describe(), "through the chat template")) << (*source)->Describe();

  // With apply_chat_template the string is one user message (Qwen's default system).
  config.apply_chat_template = true;
  config.chat_template_kwargs = "{\"unused_variable\": 1}";
  source = NewPromptSource(config);
  ASSERT_TRUE(source.ok()) << source.status();
  all = (*source)->held_out();
  for (const RunPrompt& p : (*source)->Next(1)) all.push_back(p);
  for (const RunPrompt& p : all) {
    if (p.answer == "4") {
      EXPECT_EQ(p.text, qwen_system + "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
    }
  }

  config.chat_template_kwargs = "[1]";
  EXPECT_TRUE(absl::StrContains(NewPromptSource(config).status().message(), "chat_template_kwargs"));
  config.chat_template_kwargs = "{\"x\": " + std::string(1000, '[') + std::string(1000, ']') + "}";
  EXPECT_TRUE(absl::StrContains(NewPromptSource(config).status().message(), "chat_template_kwargs: JSON nested deeper"))
      << NewPromptSource(config).status();
  config.chat_template_kwargs = "{\"x\": \"" + std::string(100000, 'a') + "\"}";
  EXPECT_TRUE(absl::StrContains(NewPromptSource(config).status().message(), "more than the limit"));
  // A directory without a template, for chat records: named.
  config.chat_template_kwargs = "";
  config.tokenizer_dir = TokenizerDir();
  EXPECT_TRUE(absl::StrContains(NewPromptSource(config).status().message(), "has no chat template"))
      << NewPromptSource(config).status();
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
  v1::RunConfig stray_chat;
  stray_chat.set_apply_chat_template(true);
  EXPECT_EQ(LoopConfigFromRun(stray_chat, root).status().code(), absl::StatusCode::kInvalidArgument);
  run.set_task("");
  run.set_apply_chat_template(true);
  run.set_chat_template_kwargs("{\"enable_thinking\": false}");
  loop = LoopConfigFromRun(run, root);
  ASSERT_TRUE(loop.ok()) << loop.status();
  EXPECT_TRUE(loop->apply_chat_template);
  EXPECT_EQ(loop->chat_template_kwargs, "{\"enable_thinking\": false}");
}

}  // namespace
}  // namespace rlfleet::controller

// The reward-model scorer behind RewardCore: a value-head model saved as safetensors is
// loaded and scores items by name; the same item scores the same, different responses
// differently; bad input names the item; a missing file names the file.
#include "services/reward/model_reward.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/model/chat_template.h"
#include "libs/model/hf_model.h"
#include "libs/model/hf_tokenizer.h"
#include "libs/model/safetensors.h"
#include "libs/model/test_util.h"

namespace rlfleet::reward {
namespace {

model::PolicyConfig Small() { return model::TinyConfig(/*max_seq_len=*/32, /*value_head=*/true); }

std::string SavedModel() {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/rm.safetensors";
  auto policy = model::Policy::Create(Small(), model::TestDevice(), /*init_seed=*/5);
  EXPECT_TRUE(policy.ok());
  EXPECT_TRUE((*policy)->SaveSafetensors(path).ok());
  return path;
}

v1::ScoreItem Item(const std::string& prompt, const std::string& response) {
  v1::ScoreItem item;
  item.set_task("reverse");
  item.set_reward_function("rm");
  item.set_prompt_text(prompt);
  item.set_response_text(response);
  return item;
}

TEST(RewardModel, ScoresByNameDeterministicallyAndNamesBadItems) {
  RewardCore core;
  RewardModelOptions options;
  options.name = "rm";
  options.safetensors_path = SavedModel();
  options.config = Small();
  ASSERT_TRUE(RegisterRewardModel(core, options).ok());

  v1::ScoreRequest request;
  *request.add_items() = Item("reverse:123", "321");
  *request.add_items() = Item("reverse:123", "321");
  *request.add_items() = Item("reverse:123", "999");
  v1::ScoreResponse response;
  ASSERT_TRUE(core.Score(request, &response).ok());
  ASSERT_EQ(response.results_size(), 3);
  EXPECT_EQ(response.results(0).reward(), response.results(1).reward());
  EXPECT_NE(response.results(0).reward(), response.results(2).reward());
  EXPECT_EQ(response.results(0).components().at("value"), response.results(0).reward());

  v1::ScoreRequest bad;
  *bad.add_items() = Item("reverse:123", "321");
  *bad.add_items() = Item("reverse:123", "3x1");
  v1::ScoreResponse ignored;
  absl::Status s = core.Score(bad, &ignored);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "items[1]")) << s;

  // Listed as a reward model.
  v1::ListRewardFunctionsResponse listed;
  ASSERT_TRUE(core.List({}, &listed).ok());
  bool found = false;
  for (const auto& f : listed.functions()) found |= f.name() == "rm" && f.kind() == v1::REWARD_KIND_REWARD_MODEL;
  EXPECT_TRUE(found);
}

// A Hugging Face reward model directory as TRL saves one (Qwen2ForSequenceClassification,
// one label, a `score` head and no LM head), for the test tokenizer (vocabulary 900) and
// Qwen2.5's chat template; `policy` is the same model in memory.
std::string RewardModelDir(std::unique_ptr<model::Policy>* policy) {
  model::PolicyConfig c;
  c.arch = "qwen2";
  c.vocab_size = 900;
  c.d_model = 32;
  c.n_layers = 1;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 64;
  c.qkv_bias = true;
  c.tie_embeddings = true;
  c.rope_theta = 1e6;
  c.max_seq_len = 128;
  c.value_head = true;  // (its bias starts at 0, as a score head has none)
  auto created = model::Policy::Create(c, "cpu", /*init_seed=*/11);
  EXPECT_TRUE(created.ok()) << created.status();
  *policy = *std::move(created);
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/rm_dir";
  std::filesystem::create_directories(dir);
  EXPECT_TRUE((*policy)->SaveSafetensors(dir + "/all.safetensors").ok());
  auto tensors = model::ReadSafetensors(dir + "/all.safetensors");
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  std::filesystem::remove(dir + "/all.safetensors");
  (*tensors)["score.weight"] = tensors->at("value_head.weight");
  tensors->erase("value_head.weight");
  tensors->erase("value_head.bias");
  EXPECT_TRUE(model::WriteSafetensors(dir + "/model.safetensors", *tensors).ok());
  nlohmann::json config = nlohmann::json::parse(model::HfConfigJson(c));
  config["architectures"] = {"Qwen2ForSequenceClassification"};
  config["id2label"] = {{"0", "LABEL_0"}};
  std::ofstream(dir + "/config.json") << config.dump(2);
  const std::string runfiles = std::string(std::getenv("TEST_SRCDIR")) + "/" + std::getenv("TEST_WORKSPACE");
  std::filesystem::copy_file(runfiles + "/libs/model/testdata/hf/tokenizer_qwen2/tokenizer.json",
                             dir + "/tokenizer.json", std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(runfiles + "/libs/model/testdata/chat/tokenizer_config.json",
                             dir + "/tokenizer_config.json", std::filesystem::copy_options::overwrite_existing);
  return dir;
}

TEST(RewardModel, AHuggingFaceRewardModelScoresItsTokenizersText) {
  std::unique_ptr<model::Policy> policy;
  const std::string dir = RewardModelDir(&policy);
  auto tokenizer = model::HfTokenizer::FromFile(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto chat = model::ChatTemplate::FromModelDir(dir);
  ASSERT_TRUE(chat.ok()) << chat.status();
  for (bool use_template : {false, true}) {
    SCOPED_TRACE(use_template ? "chat template" : "plain");
    RewardCore core;
    RewardModelOptions options;
    options.name = "rm";
    options.model_dir = dir;
    options.chat_template = use_template;
    ASSERT_TRUE(RegisterRewardModel(core, options).ok());
    v1::ScoreRequest request;
    *request.add_items() = Item("What is 2 + 2?", " 4");
    *request.add_items() = Item("What is 2 + 2?", " 5");
    v1::ScoreResponse response;
    ASSERT_TRUE(core.Score(request, &response).ok());
    ASSERT_EQ(response.results_size(), 2);
    for (int i = 0; i < 2; ++i) {
      const std::string response_text = i == 0 ? " 4" : " 5";
      std::string text = "What is 2 + 2?" + response_text;
      if (use_template) {
        auto rendered = (*chat)->Apply(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "What is 2 + 2?"},
                                                                          {"role": "assistant", "content": ")" +
                                                                     response_text + R"("}])"),
                                       false);
        ASSERT_TRUE(rendered.ok()) << rendered.status();
        EXPECT_TRUE(absl::StrContains(*rendered, "<|im_start|>assistant\n" + response_text)) << *rendered;
        text = *rendered;
      }
      auto want = policy->Values({*(*tokenizer)->Encode(text)});
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_NEAR(response.results(i).reward(), (*want)[0], 1e-5);
    }
    EXPECT_NE(response.results(0).reward(), response.results(1).reward());
  }
  // Longer than the model's window: an error naming it, not a crash.
  RewardCore core;
  RewardModelOptions options;
  options.name = "rm";
  options.model_dir = dir;
  options.max_seq_len = 8;
  ASSERT_TRUE(RegisterRewardModel(core, options).ok());
  v1::ScoreRequest request;
  *request.add_items() = Item(std::string(200, 'x'), "y");
  v1::ScoreResponse response;
  const absl::Status s = core.Score(request, &response);
  EXPECT_TRUE(absl::StrContains(s.message(), "over the reward model's 8")) << s;
  // A causal LM directory is not a reward model.
  options.model_dir =
      std::string(std::getenv("TEST_SRCDIR")) + "/" + std::getenv("TEST_WORKSPACE") + "/libs/model/testdata/hf/qwen2";
  EXPECT_TRUE(absl::StrContains(RegisterRewardModel(core, options).message(), "ForSequenceClassification"));
}

TEST(RewardModel, AMissingFileNamesIt) {
  RewardCore core;
  RewardModelOptions options;
  options.safetensors_path = "/nonexistent/rm.safetensors";
  options.config = Small();
  absl::Status s = RegisterRewardModel(core, options);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "/nonexistent/rm.safetensors")) << s;
}

}  // namespace
}  // namespace rlfleet::reward

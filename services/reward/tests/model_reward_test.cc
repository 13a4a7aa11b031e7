// The reward-model scorer behind RewardCore: a value-head model saved as safetensors is
// loaded and scores items by name; the same item scores the same, different responses
// differently; bad input names the item; a missing file names the file.
#include "services/reward/model_reward.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
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

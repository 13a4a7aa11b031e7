#include "services/reward/model_reward.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/common/status_macros.h"
#include "libs/model/tokenizer.h"

namespace rlfleet::reward {

absl::Status RegisterRewardModel(RewardCore& core, const RewardModelOptions& options) {
  model::PolicyConfig config = options.config;
  config.value_head = true;
  ASSIGN_OR_RETURN(std::unique_ptr<model::Policy> policy, model::Policy::Create(config, options.device));
  if (absl::Status s = policy->LoadSafetensors(options.safetensors_path); !s.ok()) {
    return common::Annotate(s, absl::StrCat("reward model ", options.safetensors_path));
  }
  struct Model {
    absl::Mutex mu;  // one forward pass at a time
    std::unique_ptr<model::Policy> policy;
  };
  auto shared = std::make_shared<Model>();
  shared->policy = std::move(policy);
  RewardFn fn = [shared](const v1::ScoreItem& item, v1::ScoreResult* result) -> absl::Status {
    ASSIGN_OR_RETURN(std::vector<int32_t> tokens, model::Tokenizer::EncodePrompt(item.prompt_text()));
    ASSIGN_OR_RETURN(std::vector<int32_t> response, model::Tokenizer::EncodeResponse(item.response_text()));
    tokens.insert(tokens.end(), response.begin(), response.end());
    absl::MutexLock lock(&shared->mu);
    ASSIGN_OR_RETURN(std::vector<float> values, shared->policy->Values({tokens}));
    result->set_reward(values[0]);
    result->set_parsed(true);
    (*result->mutable_components())["value"] = values[0];
    return absl::OkStatus();
  };
  v1::RewardFunctionInfo info;
  info.set_name(options.name);
  info.set_kind(v1::REWARD_KIND_REWARD_MODEL);
  info.set_description(absl::StrCat("learned scorer: value head of ", options.safetensors_path));
  for (const std::string& t : options.default_for_tasks) info.add_tasks(t);
  info.add_component_names("value");
  info.set_min_reward(-1e9f);
  info.set_max_reward(1e9f);
  info.set_needs_reference(false);
  return core.Register(std::move(info), std::move(fn), !options.default_for_tasks.empty());
}

}  // namespace rlfleet::reward

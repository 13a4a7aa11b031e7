#include "services/reward/model_reward.h"

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/common/status_macros.h"
#include "libs/model/chat_template.h"
#include "libs/model/hf_model.h"
#include "libs/model/hf_tokenizer.h"
#include "libs/model/tokenizer.h"

namespace rlfleet::reward {

namespace {

// The text of an item as the model reads it, in token ids.
using Encoder = std::function<absl::StatusOr<std::vector<int32_t>>(const v1::ScoreItem&)>;

// The built-in model: prompt and response in the built-in tasks' tokenizer.
Encoder BuiltInEncoder() {
  return [](const v1::ScoreItem& item) -> absl::StatusOr<std::vector<int32_t>> {
    ASSIGN_OR_RETURN(std::vector<int32_t> tokens, model::Tokenizer::EncodePrompt(item.prompt_text()));
    ASSIGN_OR_RETURN(std::vector<int32_t> response, model::Tokenizer::EncodeResponse(item.response_text()));
    tokens.insert(tokens.end(), response.begin(), response.end());
    return tokens;
  };
}

// A model directory's: its tokenizer.json over prompt + response, or over its chat
// template's text of them as a user and an assistant message.
absl::StatusOr<Encoder> DirectoryEncoder(const RewardModelOptions& options, int max_seq_len) {
  std::shared_ptr<model::HfTokenizer> tokenizer;
  ASSIGN_OR_RETURN(tokenizer, model::HfTokenizer::FromFile(options.model_dir));
  std::shared_ptr<model::ChatTemplate> chat;
  if (options.chat_template) {
    ASSIGN_OR_RETURN(chat, model::ChatTemplate::FromModelDir(options.model_dir));
  }
  return Encoder([tokenizer, chat, max_seq_len](const v1::ScoreItem& item) -> absl::StatusOr<std::vector<int32_t>> {
    std::string text = item.prompt_text() + item.response_text();
    if (chat != nullptr) {
      const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", item.prompt_text()}},
                                               {{"role", "assistant"}, {"content", item.response_text()}}};
      ASSIGN_OR_RETURN(text, chat->Apply(messages, /*add_generation_prompt=*/false));
    }
    ASSIGN_OR_RETURN(std::vector<int32_t> tokens, tokenizer->Encode(text));
    if (tokens.empty()) return absl::InvalidArgumentError("an empty prompt and response");
    if (static_cast<int>(tokens.size()) > max_seq_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt + response are ", tokens.size(), " tokens, over the reward model's ", max_seq_len));
    }
    return tokens;
  });
}

}  // namespace

absl::Status RegisterRewardModel(RewardCore& core, const RewardModelOptions& options) {
  std::unique_ptr<model::Policy> policy;
  Encoder encode;
  std::string source;
  if (!options.model_dir.empty()) {
    model::HfLoadOptions load;
    load.device = options.device;
    load.max_seq_len = options.max_seq_len;
    auto loaded = model::LoadHfRewardModel(options.model_dir, load);
    if (!loaded.ok()) return common::Annotate(loaded.status(), absl::StrCat("reward model ", options.model_dir));
    policy = *std::move(loaded);
    ASSIGN_OR_RETURN(encode, DirectoryEncoder(options, policy->config().max_seq_len));
    source = options.model_dir;
  } else {
    model::PolicyConfig config = options.config;
    config.value_head = true;
    ASSIGN_OR_RETURN(policy, model::Policy::Create(config, options.device));
    if (absl::Status s = policy->LoadSafetensors(options.safetensors_path); !s.ok()) {
      return common::Annotate(s, absl::StrCat("reward model ", options.safetensors_path));
    }
    encode = BuiltInEncoder();
    source = options.safetensors_path;
  }
  struct Model {
    absl::Mutex mu;  // one forward pass at a time
    std::unique_ptr<model::Policy> policy;
  };
  auto shared = std::make_shared<Model>();
  shared->policy = std::move(policy);
  RewardFn fn = [shared, encode](const v1::ScoreItem& item, v1::ScoreResult* result) -> absl::Status {
    ASSIGN_OR_RETURN(std::vector<int32_t> tokens, encode(item));
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
  info.set_description(absl::StrCat("learned scorer: value head of ", source));
  for (const std::string& t : options.default_for_tasks) info.add_tasks(t);
  info.add_component_names("value");
  info.set_min_reward(-1e9f);
  info.set_max_reward(1e9f);
  info.set_needs_reference(false);
  return core.Register(std::move(info), std::move(fn), !options.default_for_tasks.empty());
}

}  // namespace rlfleet::reward

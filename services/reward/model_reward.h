// The reward-model scorer: a libs/model transformer with a scalar value head behind the
// same Score RPC as the verifiable rewards. An item's reward is the value head's output
// at the last token of its text. Either the built-in model (safetensors + a config;
// the text is prompt + response in the built-in tasks' tokenizer), or a Hugging Face
// reward model directory (a sequence classifier with one label, hf_model.h's
// LoadHfRewardModel; the text is prompt + response, or with `chat_template` the two as
// a user and an assistant message through the directory's chat template, tokenized by
// its tokenizer.json). Register it under a name; requests pick it with reward_fn, or
// it becomes the default for `tasks`.
#ifndef RLFLEET_SERVICES_REWARD_MODEL_REWARD_H_
#define RLFLEET_SERVICES_REWARD_MODEL_REWARD_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "libs/model/policy.h"
#include "services/reward/reward_core.h"

namespace rlfleet::reward {

struct RewardModelOptions {
  std::string name = "reward_model";
  std::string safetensors_path;
  model::PolicyConfig config;  // value_head is forced on
  // A Hugging Face reward model directory instead of safetensors_path + config.
  std::string model_dir;
  bool chat_template = false;  // with model_dir: score the chat template's text
  int max_seq_len = 0;         // with model_dir: tokens scored at most; 0 = the directory's (capped)
  std::string device = "cpu";
  std::vector<std::string> default_for_tasks;  // empty: only by name
};

// Loads the model and registers it with `core`. INVALID_ARGUMENT / NOT_FOUND / DATA_LOSS
// from loading (naming the file and the tensor); ALREADY_EXISTS for a taken name.
absl::Status RegisterRewardModel(RewardCore& core, const RewardModelOptions& options);

}  // namespace rlfleet::reward

#endif  // RLFLEET_SERVICES_REWARD_MODEL_REWARD_H_

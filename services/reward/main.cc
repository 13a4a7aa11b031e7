// rlfleet-reward: the reward service. Flags + wiring only.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "libs/common/config.h"
#include "libs/rpc/server_runner.h"
#include "libs/service/serve.h"
#include "services/reward/model_reward.h"
#include "services/reward/reward_core.h"
#include "services/reward/reward_service.h"

ABSL_FLAG(std::string, reward_model, "",
          "Safetensors of a value-head model (libs/model) to serve as a reward model; empty: none.");
ABSL_FLAG(std::string, reward_model_dir, "",
          "A Hugging Face reward model directory (a sequence classifier with one label, e.g. trained with TRL's "
          "RewardTrainer; its tokenizer.json tokenizes prompt + response) to serve as a reward model; empty: none.");
ABSL_FLAG(bool, reward_model_chat_template, false,
          "--reward_model_dir: score the text of its chat template over the prompt (a user message) and the "
          "response (an assistant message) instead of prompt + response as they are.");
ABSL_FLAG(int, reward_model_max_seq_len, 0,
          "--reward_model_dir: tokens scored at most; 0 = the directory's max_position_embeddings, at most 2048.");
ABSL_FLAG(std::string, device, "cpu", "Where the reward model runs: cpu or cuda[:N].");
ABSL_FLAG(std::string, reward_model_name, "reward_model", "Name requests use (ScoreItem.reward_function).");
ABSL_FLAG(std::string, reward_model_tasks, "", "Tasks (comma-separated) whose default it becomes.");
ABSL_FLAG(int, rm_d_model, 128, "Reward model width.");
ABSL_FLAG(int, rm_n_layers, 4, "Reward model blocks.");
ABSL_FLAG(int, rm_n_heads, 4, "Reward model attention heads.");
ABSL_FLAG(int, rm_max_seq_len, 64, "Reward model: prompt + response tokens at most.");

int main(int argc, char** argv) {
  rlfleet::common::ParseFlagsWithConfig(
      argc, argv, "rlfleet-reward: scores responses.\n  rlfleet-reward --port=7001 [--auth_token_file=F]");
  auto options = rlfleet::service::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "rlfleet-reward: " << options.status() << "\n";
    return 2;
  }
  rlfleet::reward::RewardCore core;
  const bool from_dir = !absl::GetFlag(FLAGS_reward_model_dir).empty();
  if (from_dir && !absl::GetFlag(FLAGS_reward_model).empty()) {
    std::cerr << "rlfleet-reward: --reward_model and --reward_model_dir: give one\n";
    return 2;
  }
  if (!from_dir && (absl::GetFlag(FLAGS_reward_model_chat_template) || absl::GetFlag(FLAGS_reward_model_max_seq_len))) {
    std::cerr << "rlfleet-reward: --reward_model_chat_template / --reward_model_max_seq_len need --reward_model_dir\n";
    return 2;
  }
  if (!absl::GetFlag(FLAGS_reward_model).empty() || from_dir) {
    rlfleet::reward::RewardModelOptions rm;
    rm.name = absl::GetFlag(FLAGS_reward_model_name);
    rm.model_dir = absl::GetFlag(FLAGS_reward_model_dir);
    rm.chat_template = absl::GetFlag(FLAGS_reward_model_chat_template);
    rm.max_seq_len = absl::GetFlag(FLAGS_reward_model_max_seq_len);
    rm.device = absl::GetFlag(FLAGS_device);
    rm.safetensors_path = absl::GetFlag(FLAGS_reward_model);
    rm.config.d_model = absl::GetFlag(FLAGS_rm_d_model);
    rm.config.n_layers = absl::GetFlag(FLAGS_rm_n_layers);
    rm.config.n_heads = absl::GetFlag(FLAGS_rm_n_heads);
    rm.config.max_seq_len = absl::GetFlag(FLAGS_rm_max_seq_len);
    rm.default_for_tasks = absl::StrSplit(absl::GetFlag(FLAGS_reward_model_tasks), ',', absl::SkipEmpty());
    if (absl::Status s = rlfleet::reward::RegisterRewardModel(core, rm); !s.ok()) {
      std::cerr << "rlfleet-reward: " << (from_dir ? "--reward_model_dir: " : "--reward_model: ") << s << "\n";
      return 2;
    }
  }
  rlfleet::reward::RewardServiceImpl service(&core, rlfleet::rpc::CallAuthFrom(options->auth));
  rlfleet::rpc::ServerRunner runner(*options);
  runner.AddService(&service);
  rlfleet::service::ServeSpec spec;
  spec.binary = "rlfleet-reward";
  spec.role = rlfleet::v1::REPLICA_ROLE_REWARD;
  return rlfleet::service::ServeUntilTerminated(runner, spec);
}

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
  if (!absl::GetFlag(FLAGS_reward_model).empty()) {
    rlfleet::reward::RewardModelOptions rm;
    rm.name = absl::GetFlag(FLAGS_reward_model_name);
    rm.safetensors_path = absl::GetFlag(FLAGS_reward_model);
    rm.config.d_model = absl::GetFlag(FLAGS_rm_d_model);
    rm.config.n_layers = absl::GetFlag(FLAGS_rm_n_layers);
    rm.config.n_heads = absl::GetFlag(FLAGS_rm_n_heads);
    rm.config.max_seq_len = absl::GetFlag(FLAGS_rm_max_seq_len);
    rm.default_for_tasks = absl::StrSplit(absl::GetFlag(FLAGS_reward_model_tasks), ',', absl::SkipEmpty());
    if (absl::Status s = rlfleet::reward::RegisterRewardModel(core, rm); !s.ok()) {
      std::cerr << "rlfleet-reward: --reward_model: " << s << "\n";
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

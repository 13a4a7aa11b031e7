// rlfleet-reward: the reward service. Flags + wiring only.
#include <iostream>

#include "libs/common/config.h"
#include "libs/rpc/server_runner.h"
#include "services/reward/reward_core.h"
#include "services/reward/reward_service.h"

int main(int argc, char** argv) {
  rlfleet::common::ParseFlagsWithConfig(
      argc, argv, "rlfleet-reward: scores responses.\n  rlfleet-reward --port=7001 [--auth_token_file=F]");
  auto options = rlfleet::rpc::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "rlfleet-reward: " << options.status() << "\n";
    return 2;
  }
  rlfleet::reward::RewardCore core;
  rlfleet::reward::RewardServiceImpl service(&core, rlfleet::rpc::CallAuth{options->auth.token});
  rlfleet::rpc::ServerRunner runner(*options);
  runner.AddService(&service);
  if (absl::Status s = runner.Start(); !s.ok()) {
    std::cerr << "rlfleet-reward: " << s << "\n";
    return 1;
  }
  std::cout << "rlfleet-reward listening on " << runner.address() << std::endl;
  const int signo = runner.WaitForTermination();
  std::cout << "rlfleet-reward stopped" << (signo ? " on signal" : "") << std::endl;
  return 0;
}

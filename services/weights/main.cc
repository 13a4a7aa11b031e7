// rlfleet-weights: the weight-broadcast service (first slice: verified rounds over the
// trainer's file hand-off). Flags + wiring only.
#include <iostream>

#include "absl/flags/flag.h"
#include "libs/common/config.h"
#include "libs/registry/registrar.h"
#include "libs/rpc/server_runner.h"
#include "services/weights/weights_core.h"
#include "services/weights/weights_service.h"

int main(int argc, char** argv) {
  rlfleet::common::ParseFlagsWithConfig(argc, argv, "rlfleet-weights: weight-broadcast service.");
  auto options = rlfleet::rpc::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "rlfleet-weights: " << options.status() << "\n";
    return 2;
  }
  rlfleet::rpc::ClientOptions client;  // to the replicas, with this server's token
  client.auth.token = options->auth.token;
  rlfleet::weights::WeightsCore core([client](const std::string& address) {
    return rlfleet::weights::NewGrpcDestination(client, address);
  });
  rlfleet::weights::WeightsServiceImpl service(&core, rlfleet::rpc::CallAuth{options->auth.token});
  rlfleet::rpc::ServerRunner runner(*options);
  runner.AddService(&service);
  if (absl::Status s = runner.Start(); !s.ok()) {
    std::cerr << "rlfleet-weights: " << s << "\n";
    return 1;
  }
  std::cout << "rlfleet-weights listening on " << runner.address() << std::endl;
  auto registrar = rlfleet::registry::RegisterFromFlags(rlfleet::v1::REPLICA_ROLE_WEIGHTS, runner.address(),
                                                        runner.metrics_port(), nullptr, "rlfleet-weights");
  if (!registrar.ok()) {
    std::cerr << "rlfleet-weights: " << registrar.status() << "\n";
    return 1;
  }
  const int signo = runner.WaitForTermination();
  std::cout << "rlfleet-weights stopped" << (signo ? " on signal" : "") << std::endl;
  return 0;
}

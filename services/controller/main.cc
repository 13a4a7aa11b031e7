// rlfleet-controller: the fleet's single controller. Flags + wiring only.
#include <iostream>

#include "absl/flags/flag.h"
#include "libs/common/clock.h"
#include "libs/common/config.h"
#include "libs/registry/registry.h"
#include "libs/rpc/server_runner.h"
#include "services/controller/controller_core.h"
#include "services/controller/controller_service.h"

ABSL_FLAG(std::string, registry, "memory://",
          "Replica registry: memory:// (in-process) or redis://host:port.");

int main(int argc, char** argv) {
  rlfleet::common::ParseFlagsWithConfig(
      argc, argv,
      "rlfleet-controller: registry and control of an rlfleet fleet.\n"
      "  rlfleet-controller --port=7000 [--registry=memory://] [--auth_token_file=F] ...");
  auto options = rlfleet::rpc::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "rlfleet-controller: " << options.status() << "\n";
    return 2;
  }
  rlfleet::common::Clock* clock = rlfleet::common::Clock::Real();
  auto registry = rlfleet::registry::OpenRegistry(absl::GetFlag(FLAGS_registry), clock);
  if (!registry.ok()) {
    std::cerr << "rlfleet-controller: --registry: " << registry.status() << "\n";
    return 2;
  }
  rlfleet::controller::ControllerCore core(registry->get(), clock);
  const rlfleet::rpc::CallAuth auth{options->auth.token};
  rlfleet::controller::RegistryServiceImpl registry_service(&core, auth);
  rlfleet::controller::ControllerServiceImpl controller_service(&core, auth);

  rlfleet::rpc::ServerRunner runner(*options);
  runner.AddService(&registry_service);
  runner.AddService(&controller_service);
  if (absl::Status status = runner.Start(); !status.ok()) {
    std::cerr << "rlfleet-controller: " << status << "\n";
    return 1;
  }
  std::cout << "rlfleet-controller listening on " << runner.address()
            << (options->auth.token.empty() ? "" : " (bearer token required)")
            << (options->auth.tls_enabled_for_server() ? " (TLS)" : "") << std::endl;
  const int signo = runner.WaitForTermination();
  std::cout << "rlfleet-controller stopped" << (signo ? " on signal" : "") << std::endl;
  return 0;
}

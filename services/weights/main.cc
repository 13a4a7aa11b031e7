// rlfleet-weights: the weight-broadcast service (first slice: verified versions served
// to the replicas from memory over UCX, or as the trainer's file). Flags + wiring only.
#include <iostream>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "libs/common/config.h"
#include "libs/registry/registrar.h"
#include "libs/rpc/server_runner.h"
#include "libs/transport/ucx/ucx_transport.h"
#include "services/weights/weights_core.h"
#include "services/weights/weights_service.h"

ABSL_FLAG(std::string, data_plane, "ucx",
          "How replicas get versions: ucx (pulled from this service's memory) or none (the trainer's file).");
ABSL_DECLARE_FLAG(std::string, host);  // libs/rpc's server flag

int main(int argc, char** argv) {
  rlfleet::common::ParseFlagsWithConfig(argc, argv, "rlfleet-weights: weight-broadcast service.");
  auto options = rlfleet::rpc::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "rlfleet-weights: " << options.status() << "\n";
    return 2;
  }
  rlfleet::rpc::ClientOptions client;  // to the replicas, with this server's token
  client.auth.token = options->auth.token;
  // Versions are served from memory over UCX (on loopback when serving on it).
  std::unique_ptr<rlfleet::transport::Transport> data_plane;
  if (absl::GetFlag(FLAGS_data_plane) == "ucx") {
    rlfleet::transport::UcxOptions ucx;
    const std::string host = absl::GetFlag(FLAGS_host);
    ucx.loopback_only = host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
    auto t = rlfleet::transport::UcxTransport::Create(ucx);
    if (t.ok()) {
      data_plane = std::move(*t);
    } else {
      std::cerr << "rlfleet-weights: no UCX data plane (" << t.status() << "); replicas read the trainer's file\n";
    }
  } else if (absl::GetFlag(FLAGS_data_plane) != "none") {
    std::cerr << "rlfleet-weights: --data_plane=" << absl::GetFlag(FLAGS_data_plane) << ": want ucx or none\n";
    return 2;
  }
  rlfleet::weights::WeightsCore core(
      [client](const std::string& address) { return rlfleet::weights::NewGrpcDestination(client, address); },
      data_plane.get());
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

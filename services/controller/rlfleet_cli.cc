// rlfleet: the command-line interface to a running fleet.
//
//   rlfleet status   [--controller=HOST:PORT]   run state, replicas per role, health
//   rlfleet replicas [--role=rollout]           registered replicas
//   rlfleet health                              the controller's health (exit 0 if SERVING)
//
// Auth flags (--auth_token_file, --tls_ca, --tls_cert, --tls_key) as for every binary.
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "libs/common/config.h"
#include "rlfleet/v1/common.pb.h"
#include "services/controller/controller_client.h"

ABSL_FLAG(std::string, controller, "127.0.0.1:7000", "Controller address (host:port).");
ABSL_FLAG(std::string, role, "", "replicas: only this role (rollout, reward, ...).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(5), "Deadline of each call.");

namespace {

using rlfleet::controller::ControllerClient;
namespace v1 = rlfleet::v1;

std::string RoleName(v1::ReplicaRole role) {
  std::string name = v1::ReplicaRole_Name(role);
  const std::string prefix = "REPLICA_ROLE_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  return absl::AsciiStrToLower(name);
}

int Fail(const absl::Status& status) {
  std::cerr << "rlfleet: " << status << "\n";
  return 1;
}

int Health(ControllerClient& client) {
  auto health = client.CheckHealth();
  if (!health.ok()) return Fail(health.status());
  const bool serving = health->status() == grpc::health::v1::HealthCheckResponse::SERVING;
  std::cout << "controller " << client.options().target << ": "
            << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(health->status())
            << "\n";
  return serving ? 0 : 1;
}

int Status(ControllerClient& client) {
  if (int rc = Health(client); rc != 0) return rc;
  auto status = client.GetStatus();
  if (!status.ok()) return Fail(status.status());
  std::cout << "run: " << (status->run_id().empty() ? "(none)" : status->run_id())
            << "  state: " << v1::RunState_Name(status->state())
            << "  step: " << status->step()
            << "  policy version: " << status->policy_version().version() << "\n";
  if (status->replicas().empty()) std::cout << "replicas: none registered\n";
  for (const v1::RoleSummary& role : status->replicas()) {
    std::cout << absl::StrFormat("  %-10s registered %u  admitted %u\n", RoleName(role.role()),
                                 role.registered(), role.admitted());
  }
  return 0;
}

int Replicas(ControllerClient& client) {
  v1::ListReplicasRequest request;
  const std::string role = absl::AsciiStrToUpper(absl::GetFlag(FLAGS_role));
  if (!role.empty()) {
    v1::ReplicaRole parsed;
    if (!v1::ReplicaRole_Parse("REPLICA_ROLE_" + role, &parsed)) {
      return Fail(absl::InvalidArgumentError("--role " + absl::GetFlag(FLAGS_role) +
                                             " is not a role"));
    }
    request.set_role(parsed);
  }
  for (;;) {
    auto page = client.ListReplicas(request);
    if (!page.ok()) return Fail(page.status());
    for (const v1::ReplicaInfo& r : page->replicas()) {
      std::cout << absl::StrFormat("%-32s %-10s %-22s version %-6u %s\n", r.replica_id(),
                                   RoleName(r.role()), r.grpc_address(),
                                   r.policy_version().version(),
                                   r.admitted() ? "admitted" : "not admitted");
    }
    if (page->next_page_token().empty()) break;
    request.mutable_page()->set_page_token(page->next_page_token());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args = rlfleet::common::ParseFlagsWithConfig(
      argc, argv, "rlfleet status|replicas|health [--controller=HOST:PORT]");
  if (args.size() != 2) {
    std::cerr << "usage: rlfleet status|replicas|health [--controller=HOST:PORT]\n";
    return 2;
  }
  auto options = rlfleet::rpc::ClientOptionsFromFlags(absl::GetFlag(FLAGS_controller));
  if (!options.ok()) return Fail(options.status());
  options->default_timeout = absl::GetFlag(FLAGS_timeout);
  auto client = ControllerClient::Connect(*options);
  if (!client.ok()) return Fail(client.status());
  const std::string& command = args[1];
  if (command == "status") return Status(**client);
  if (command == "replicas") return Replicas(**client);
  if (command == "health") return Health(**client);
  std::cerr << "rlfleet: unknown command `" << command << "` (status, replicas, health)\n";
  return 2;
}

// rlfleet-controller: the fleet's single controller. Flags + wiring only.
#include <atomic>
#include <iostream>
#include <optional>
#include <set>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "libs/common/clock.h"
#include "libs/common/config.h"
#include "libs/registry/registry.h"
#include "libs/rpc/server_runner.h"
#include "services/controller/controller_core.h"
#include "services/controller/controller_service.h"
#include "services/controller/run_manager.h"
#include "services/controller/run_peers_grpc.h"

ABSL_FLAG(std::string, registry, "memory://",
          "Replica registry: memory:// (in-process) or redis://host:port.");
ABSL_FLAG(std::string, rollout, "",
          "Rollout replica addresses (host:port, comma-separated) runs use, besides the rollout replicas "
          "registered with this controller (rlfleet-rollout --registry_address), which join and leave "
          "runs as they register and deregister.");
ABSL_FLAG(std::string, reward, "", "Reward service address runs use.");
ABSL_FLAG(std::string, buffer, "", "Experience buffer address runs use.");
ABSL_FLAG(std::string, trainer, "", "Trainer address runs use.");
ABSL_FLAG(std::string, runs_dir, "rlfleet-runs",
          "Each run writes metrics.csv and reward_curve.png into <runs_dir>/<run id>; empty: none.");
ABSL_FLAG(std::string, scaler, "",
          "What acts on Scale (the desired counts GetStatus reports): \"launcher\" when "
          "deploy/local/launch.sh started this controller; empty: Scale is FAILED_PRECONDITION.");
ABSL_FLAG(absl::Duration, peer_timeout, absl::Seconds(120), "Deadline of each call a run makes.");

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
  core.SetScaler(absl::GetFlag(FLAGS_scaler));
  core.StartWatching(absl::Milliseconds(200));  // WatchReplicas sees changes within this
  const rlfleet::rpc::CallAuth auth{options->auth.token};
  rlfleet::controller::RegistryServiceImpl registry_service(&core, auth);
  // Runs: the RL loop over the peers named by flags (registry discovery comes later).
  std::unique_ptr<rlfleet::controller::RunManager> runs;
  rlfleet::rpc::ClientOptions client;
  client.auth.token = options->auth.token;
  if (!absl::GetFlag(FLAGS_reward).empty() || !absl::GetFlag(FLAGS_rollout).empty()) {
    auto factory = [client, &core]() -> absl::StatusOr<rlfleet::controller::RunPeers> {
      using namespace rlfleet::controller;  // NOLINT: the factory functions
      const absl::Duration timeout = absl::GetFlag(FLAGS_peer_timeout);
      RunPeers peers;
      std::set<std::string> addresses;
      for (absl::string_view a : absl::StrSplit(absl::GetFlag(FLAGS_rollout), ',', absl::SkipEmpty())) {
        addresses.insert(std::string(a));
      }
      // And the rollout replicas registered now (later ones join the run as they come).
      rlfleet::v1::ListReplicasRequest list;
      list.set_role(rlfleet::v1::REPLICA_ROLE_ROLLOUT);
      rlfleet::v1::ListReplicasResponse listed;
      if (core.ListReplicas(list, &listed).ok()) {
        for (const auto& r : listed.replicas()) addresses.insert(r.grpc_address());
      }
      for (const std::string& a : addresses) {
        auto r = NewGrpcRolloutReplica(client, a, timeout);
        if (!r.ok()) return r.status();
        peers.rollouts.push_back(std::move(*r));
      }
      if (peers.rollouts.empty()) {
        return absl::FailedPreconditionError(
            "the controller has no rollout replica: none registered and no --rollout");
      }
      auto reward = NewGrpcRewardPeer(client, absl::GetFlag(FLAGS_reward), timeout);
      auto buffer = NewGrpcBufferPeer(client, absl::GetFlag(FLAGS_buffer), timeout);
      auto trainer = NewGrpcTrainerPeer(client, absl::GetFlag(FLAGS_trainer), timeout);
      if (!reward.ok()) return reward.status();
      if (!buffer.ok()) return buffer.status();
      if (!trainer.ok()) return trainer.status();
      peers.reward = std::move(*reward);
      peers.buffer = std::move(*buffer);
      peers.trainer = std::move(*trainer);
      return peers;
    };
    runs = std::make_unique<rlfleet::controller::RunManager>(
        factory, [](const std::string& line) { std::cout << line << std::endl; }, absl::GetFlag(FLAGS_runs_dir));
  }
  rlfleet::controller::ControllerServiceImpl controller_service(&core, runs.get(), auth);

  // Discovery: rollout replicas that register join the active run (with its current
  // weights) and those that deregister or expire leave it (drained).
  std::atomic<bool> stopping{false};
  std::thread discovery;
  if (runs != nullptr) {
    rlfleet::v1::WatchReplicasRequest watch;
    watch.set_role(rlfleet::v1::REPLICA_ROLE_ROLLOUT);
    auto sub = core.Watch(watch);
    if (sub.ok()) {
      discovery = std::thread([sub = *sub, &runs, &stopping, client]() {
        using rlfleet::v1::ReplicaEvent;
        while (!stopping) {
          std::optional<ReplicaEvent> event = sub->Next(absl::Milliseconds(500));
          if (!event) continue;
          const std::string& address = event->replica().grpc_address();
          absl::Status s;
          if (event->type() == rlfleet::v1::REPLICA_EVENT_TYPE_ADDED) {
            auto replica = rlfleet::controller::NewGrpcRolloutReplica(client, address, absl::GetFlag(FLAGS_peer_timeout));
            s = replica.ok() ? runs->AdmitRollout(std::move(*replica)) : replica.status();
          } else if (event->type() == rlfleet::v1::REPLICA_EVENT_TYPE_REMOVED ||
                     event->type() == rlfleet::v1::REPLICA_EVENT_TYPE_EXPIRED) {
            s = runs->RemoveRollout(address);
          }
          // No active run (it will list the registry when it starts), or already in /
          // out of the pool: nothing to do.
          if (!s.ok() && !absl::IsFailedPrecondition(s) && !absl::IsAlreadyExists(s) && !absl::IsNotFound(s)) {
            std::cout << "discovery: rollout replica " << address << ": " << s << std::endl;
          }
        }
      });
    }
  }

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
  stopping = true;
  if (discovery.joinable()) discovery.join();
  std::cout << "rlfleet-controller stopped" << (signo ? " on signal" : "") << std::endl;
  return 0;
}

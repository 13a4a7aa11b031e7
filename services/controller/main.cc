// rlfleet-controller: the fleet's single controller. Flags + wiring only.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "libs/common/clock.h"
#include "libs/common/config.h"
#include "libs/registry/registry.h"
#include "libs/rpc/server_runner.h"
#include "libs/service/serve.h"
#include "services/controller/autoscaler.h"
#include "services/controller/controller_core.h"
#include "services/controller/controller_service.h"
#include "services/controller/discovery.h"
#include "services/controller/run_manager.h"
#include "services/controller/run_peers_factory.h"
#include "services/controller/run_store.h"

ABSL_FLAG(std::string, registry, "memory://", "Replica registry: memory:// (in-process) or redis://host:port.");
ABSL_FLAG(std::string, rollout, "",
          "Rollout replica addresses (host:port, comma-separated) runs use, besides the rollout replicas "
          "registered with this controller (rlfleet-rollout --registry_address), which join and leave "
          "runs as they register and deregister.");
ABSL_FLAG(std::string, reward, "", "Reward service address runs use; empty: the registered one.");
ABSL_FLAG(std::string, buffer, "", "Experience buffer address runs use; empty: the registered one.");
ABSL_FLAG(std::string, trainer, "", "Trainer address runs use; empty: the registered one.");
ABSL_FLAG(std::string, weights, "",
          "Weights service (rlfleet-weights) runs publish versions through; empty: the registered one, and "
          "without one the trainer's file goes to the replicas directly.");
ABSL_FLAG(std::string, data_root, "",
          "Directory that a run's dataset and tokenizer directory (RunConfig.dataset / tokenizer_dir) must lie "
          "under; empty: runs over datasets are refused.");
ABSL_FLAG(std::string, runs_dir, "rlfleet-runs",
          "Each run writes metrics.csv and reward_curve.png into <runs_dir>/<run id>; empty: none.");
ABSL_FLAG(std::string, scaler, "",
          "What acts on Scale (the desired counts GetStatus reports): \"launcher\" when "
          "deploy/local/launch.sh started this controller; empty: Scale is FAILED_PRECONDITION.");
ABSL_FLAG(std::string, run_store, "registry",
          "Where the active run's record is kept, so that a restarted controller resumes the run from its "
          "last step: redis://host:port[/prefix]; \"registry\" (default): the --registry's Redis when it "
          "is one; empty: nowhere (a restarted controller forgets its run).");
ABSL_FLAG(absl::Duration, resume_within, absl::Minutes(5),
          "A resumed run waits this long for its peers (its rollout replicas registered) before it fails.");
ABSL_FLAG(absl::Duration, peer_timeout, absl::Seconds(120), "Deadline of each call a run makes.");
ABSL_FLAG(std::string, autoscale_rollout, "",
          "MIN:MAX: scale rollout replicas between these from load (the trainer's wait for rollouts, the "
          "replicas' busy fraction), through Scale (acted on by the --scaler) and the "
          "rlfleet_autoscale_rollout_replicas gauge; empty: off.");
ABSL_FLAG(absl::Duration, autoscale_interval, absl::Seconds(5), "Autoscaling: time between load samples.");
ABSL_FLAG(absl::Duration, autoscale_cooldown, absl::Seconds(30), "Autoscaling: no change within this of the last.");

int main(int argc, char** argv) {
  rlfleet::common::ParseFlagsWithConfig(
      argc, argv,
      "rlfleet-controller: registry and control of an rlfleet fleet.\n"
      "  rlfleet-controller --port=7000 [--registry=memory://] [--auth_token_file=F] ...");
  auto options = rlfleet::service::ServerOptionsFromFlags();
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
  const rlfleet::rpc::CallAuth auth = rlfleet::rpc::CallAuthFrom(options->auth);
  rlfleet::controller::RegistryServiceImpl registry_service(&core, auth);
  // Runs: the RL loop over peers from the flags, else from the registry (services
  // started with --registry_address=<this controller>).
  rlfleet::rpc::ClientOptions client;  // to the run's peers: the controller's role when it holds the admin token
  client.auth.token = options->auth.token;
  client.auth.admin_token = options->auth.admin_token;
  // The fleet's message limit on the peers' calls too (a reward batch is split to it).
  client.max_message_bytes = options->max_message_bytes;
  rlfleet::controller::PeerAddresses addresses;
  addresses.rollout = absl::GetFlag(FLAGS_rollout);
  addresses.reward = absl::GetFlag(FLAGS_reward);
  addresses.buffer = absl::GetFlag(FLAGS_buffer);
  addresses.trainer = absl::GetFlag(FLAGS_trainer);
  addresses.weights = absl::GetFlag(FLAGS_weights);
  addresses.timeout = absl::GetFlag(FLAGS_peer_timeout);
  rlfleet::controller::RunPeersFactory peers(&core, client, addresses);
  std::string run_store_url = absl::GetFlag(FLAGS_run_store);
  if (run_store_url == "registry") {
    const std::string registry_url = absl::GetFlag(FLAGS_registry);
    run_store_url = absl::StartsWith(registry_url, "redis://") ? registry_url : "";
  }
  auto run_store = rlfleet::controller::OpenRunStore(run_store_url);
  if (!run_store.ok()) {
    std::cerr << "rlfleet-controller: --run_store: " << run_store.status() << "\n";
    return 2;
  }
  // The desired counts (Scale) a previous controller was given, and later ones, kept there.
  if (absl::Status s = core.UseDesiredStore(run_store->get()); !s.ok()) {
    std::cerr << "rlfleet-controller: --run_store: the saved desired counts do not read (starting with none): " << s
              << "\n";
  }
  rlfleet::controller::RunManager runs([&peers] { return peers.Make(); },
                                       [](const std::string& line) { std::cout << line << std::endl; },
                                       absl::GetFlag(FLAGS_runs_dir), run_store->get(), absl::GetFlag(FLAGS_data_root));
  rlfleet::controller::ControllerServiceImpl controller_service(&core, &runs, auth);
  auto discovery = rlfleet::controller::RolloutDiscovery::Start(
      &core, &runs, [&peers](const std::string& address) { return peers.Replica(address); },
      [](const std::string& line) { std::cout << line << std::endl; });
  if (!discovery.ok()) {
    std::cerr << "rlfleet-controller: " << discovery.status() << "\n";
    return 1;
  }

  // Closed-loop rollout autoscaling (autoscaler.h).
  std::unique_ptr<rlfleet::controller::Autoscaler> autoscaler;
  if (const std::string bounds = absl::GetFlag(FLAGS_autoscale_rollout); !bounds.empty()) {
    rlfleet::controller::AutoscaleConfig config;
    config.interval = absl::GetFlag(FLAGS_autoscale_interval);
    config.cooldown = absl::GetFlag(FLAGS_autoscale_cooldown);
    if (absl::Status s = rlfleet::controller::ParseReplicaBounds(bounds, &config); !s.ok()) {
      std::cerr << "rlfleet-controller: --autoscale_rollout: " << s.message() << "\n";
      return 2;
    }
    auto sample = [&core, &runs]() -> absl::StatusOr<rlfleet::controller::LoadSample> {
      rlfleet::controller::LoadSample s;
      rlfleet::v1::ListReplicasRequest list;
      list.set_role(rlfleet::v1::REPLICA_ROLE_ROLLOUT);
      list.set_only_admitted(true);
      list.mutable_page()->set_page_size(rlfleet::controller::kMaxPageSize);
      std::vector<rlfleet::v1::ReplicaInfo> replicas;
      while (true) {
        rlfleet::v1::ListReplicasResponse page;
        if (absl::Status st = core.ListReplicas(list, &page); !st.ok()) return st;
        replicas.insert(replicas.end(), page.replicas().begin(), page.replicas().end());
        if (page.next_page_token().empty()) break;
        list.mutable_page()->set_page_token(page.next_page_token());
      }
      rlfleet::controller::FillRolloutLoad(replicas, absl::Now(), rlfleet::controller::kMaxHeartbeatSilence, &s);
      s.run_active = runs.HasActiveRun();
      if (std::optional<rlfleet::controller::LoopProgress> p = runs.ActiveProgress()) {
        const double step = p->generate_seconds + p->train_seconds + p->sync_seconds;
        s.trainer_wait_fraction = step > 0 ? p->generate_seconds / step : 0;
      }
      return s;
    };
    auto scale = [&core](int desired) {
      rlfleet::v1::ScaleRequest request;
      request.set_role(rlfleet::v1::REPLICA_ROLE_ROLLOUT);
      request.set_target_count(desired);
      rlfleet::v1::ScaleResponse response;
      return core.Scale(request, &response);
    };
    autoscaler = std::make_unique<rlfleet::controller::Autoscaler>(
        config, sample, scale, [](const std::string& line) { std::cout << line << std::endl; });
    std::cout << "rlfleet-controller: autoscaling rollout replicas within " << config.min_replicas << ".."
              << config.max_replicas << std::endl;
  }

  rlfleet::rpc::ServerRunner runner(*options);
  runner.AddService(&registry_service);
  runner.AddService(&controller_service);
  rlfleet::service::ServeSpec spec;
  spec.binary = "rlfleet-controller";  // (the registry itself: it does not register)
  // After the server: the run's peers find this controller while it waits for them.
  spec.started = [&runs](rlfleet::rpc::ServerRunner&) {
    if (absl::Status s = runs.Recover(absl::GetFlag(FLAGS_resume_within)); !s.ok()) {
      std::cerr << "rlfleet-controller: no run resumed: " << s << "\n";
    }
  };
  spec.stopping = [&discovery] { discovery->reset(); };  // before the runs it admits into
  return rlfleet::service::ServeUntilTerminated(runner, spec);
}

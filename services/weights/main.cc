// rlfleet-weights: the weight-broadcast service (first slice: verified versions served
// to the replicas from memory over UCX, or as the trainer's file). Flags + wiring only.
#include <algorithm>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "libs/common/config.h"
#include "libs/rpc/server_runner.h"
#include "libs/service/serve.h"
#include "libs/transport/data_plane.h"
#include "services/weights/weights_core.h"
#include "services/weights/weights_service.h"

ABSL_FLAG(int, relay_fanout, 0,
          "Relay tree: this service sends each version to at most this many replicas, and every replica "
          "that has it serves at most this many more (1: a chain). 0: every replica pulls from this service.");

ABSL_FLAG(bool, push, true,
          "Push versions to replicas that have a data plane through the resharding executor (each replica only "
          "its layout's bytes; with --relay_fanout, chains that relay every chunk as it arrives); a replica the "
          "push misses pulls instead. false: every replica pulls.");

ABSL_FLAG(int, keep_versions, 2,
          "The newest this many versions stay in memory for syncs (2..8); older ones give their memory to the "
          "next version pulled from the trainer, so that no publish faults in fresh memory.");

ABSL_FLAG(std::string, host_copy, "on_demand",
          "A version the trainer publishes with its GPU copy (CUDA IPC; replicas on CUDA devices of its host "
          "install from that): on_demand pulls its bytes here only when a destination needs them (another host, "
          "a CPU replica, a fallback, a push round), from the trainer's memory while it holds the version; "
          "always pulls every version at publish, as for versions without a GPU copy.");

ABSL_FLAG(int64_t, prefault_mib, 0,
          "Fault in this much memory at start for each of the first --keep_versions versions pulled from the "
          "trainer (about the model's f32 size), and for the push copy, so that no publish pays for fresh memory; "
          "later versions reuse older ones'. 0: none.");

ABSL_FLAG(std::string, publish_dir, "",
          "Directory the trainer publishes version files into (its --publish_dir): a FILE descriptor "
          "(PublishVersion) must name a regular file under it. Empty: FILE descriptors are refused (versions "
          "come from the trainer's memory over the data plane).");

ABSL_FLAG(int64_t, max_version_mib, 16384,
          "Largest version accepted (a safetensors image, or a sharded layout's tensors), in MiB: sizes in a "
          "request are checked against it before anything is allocated.");

int main(int argc, char** argv) {
  rlfleet::common::ParseFlagsWithConfig(argc, argv, "rlfleet-weights: weight-broadcast service.");
  auto options = rlfleet::service::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "rlfleet-weights: " << options.status() << "\n";
    return 2;
  }
  rlfleet::rpc::ClientOptions client;  // to the replicas, with this server's token
  client.auth.token = options->auth.token;
  // Versions are served from memory over the data plane.
  auto data_plane =
      rlfleet::transport::OpenDataPlaneFromFlags(options->host, "rlfleet-weights", "replicas read the trainer's file");
  if (!data_plane.ok()) {
    std::cerr << "rlfleet-weights: " << data_plane.status() << "\n";
    return 2;
  }
  rlfleet::weights::WeightsCore core(
      [client](const std::string& address) { return rlfleet::weights::NewGrpcDestination(client, address); },
      data_plane->get(), std::max(0, absl::GetFlag(FLAGS_relay_fanout)));
  core.EnablePush(absl::GetFlag(FLAGS_push));
  core.SetFileRoot(absl::GetFlag(FLAGS_publish_dir));
  if (absl::GetFlag(FLAGS_max_version_mib) < 1 || absl::GetFlag(FLAGS_max_version_mib) > (int64_t{1} << 24)) {
    std::cerr << "rlfleet-weights: --max_version_mib: want 1..2^24, got " << absl::GetFlag(FLAGS_max_version_mib)
              << "\n";
    return 2;
  }
  core.SetMaxVersionBytes(static_cast<uint64_t>(absl::GetFlag(FLAGS_max_version_mib)) << 20);
  if (absl::GetFlag(FLAGS_keep_versions) < 2 || absl::GetFlag(FLAGS_keep_versions) > 8) {
    std::cerr << "rlfleet-weights: --keep_versions: want 2..8 (the latest stays syncable while the next is "
                 "pulled), got "
              << absl::GetFlag(FLAGS_keep_versions) << "\n";
    return 2;
  }
  core.SetKeepVersions(absl::GetFlag(FLAGS_keep_versions));
  if (const std::string host_copy = absl::GetFlag(FLAGS_host_copy); host_copy != "on_demand" && host_copy != "always") {
    std::cerr << "rlfleet-weights: --host_copy: want on_demand or always, got `" << host_copy << "`\n";
    return 2;
  }
  core.SetDeferHostCopy(absl::GetFlag(FLAGS_host_copy) == "on_demand");
  core.SetLogger([](const std::string& line) { std::cout << "rlfleet-weights: " << line << std::endl; });
  if (absl::GetFlag(FLAGS_prefault_mib) > 0) {
    core.PrefaultVersionMemory(static_cast<uint64_t>(absl::GetFlag(FLAGS_prefault_mib)) << 20);
  }
  rlfleet::weights::WeightsServiceImpl service(&core, rlfleet::rpc::CallAuthFrom(options->auth));
  rlfleet::rpc::ServerRunner runner(*options);
  runner.AddService(&service);
  rlfleet::service::ServeSpec spec;
  spec.binary = "rlfleet-weights";
  spec.role = rlfleet::v1::REPLICA_ROLE_WEIGHTS;
  return rlfleet::service::ServeUntilTerminated(runner, spec);
}

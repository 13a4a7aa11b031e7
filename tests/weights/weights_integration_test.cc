// The weights service between real processes: the trainer publishes a version (a file
// with its digest), rlfleet-weights verifies it and has a registered rollout replica
// pull it from its memory over UCX and install it (the replica then serves that
// version, with the trainer's file gone), while a replica that is not there fails at
// its deadline without holding up the round.
#include <grpcpp/create_channel.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "rlfleet/v1/rollout.grpc.pb.h"
#include "rlfleet/v1/trainer.grpc.pb.h"
#include "rlfleet/v1/weights.grpc.pb.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

using testing::Subprocess;

template <typename Service>
std::unique_ptr<typename Service::Stub> Stub(const std::string& address) {
  return Service::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

std::unique_ptr<grpc::ClientContext> Context(int seconds = 60) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return c;
}

// Registers the replica at `address` as destination `id`, one that may relay.
void Register(v1::WeightsService::Stub& service, const std::string& id, const std::string& address) {
  v1::RegisterDestinationRequest reg;
  reg.set_replica_id(id);
  reg.set_grpc_address(address);
  reg.set_can_relay(true);
  v1::RegisterDestinationResponse out;
  grpc::Status s = service.RegisterDestination(Context().get(), reg, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

// Starts `n` rollout replicas into `rollouts`, each registered with `service` as r<i>;
// their addresses (fewer if one did not start).
std::vector<std::string> StartReplicas(Subprocess* rollouts, int n, v1::WeightsService::Stub& service) {
  std::vector<std::string> addresses;
  for (int i = 0; i < n; ++i) {
    auto r = testing::StartService(rollouts[i], "services/rollout/rlfleet-rollout", {"--threads=1"});
    EXPECT_TRUE(r.ok()) << rollouts[i].output();
    if (!r.ok()) break;
    addresses.push_back(*r);
    Register(service, absl::StrCat("r", i), *r);
  }
  return addresses;
}

// Syncs destination `id` to the latest version and installs it; its status.
v1::DestinationSyncStatus SyncAndInstall(v1::WeightsService::Stub& service, const std::string& id) {
  v1::SyncVersionRequest sync;
  sync.set_replica_id(id);
  sync.set_commit(true);
  v1::SyncVersionResponse synced;
  grpc::Status s = service.SyncVersion(Context().get(), sync, &synced);
  EXPECT_TRUE(s.ok()) << id << ": " << s.error_message();
  return synced.status();
}

TEST(WeightsService, TheTrainersVersionReachesAReplicaAndADeadOneFailsAtItsDeadline) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/published";
  Subprocess trainer, rollout, weights;
  auto t = testing::StartService(trainer, "services/trainer/rlfleet-trainer", {"--publish_dir=" + dir, "--threads=1"});
  // (the trainer's files are read only under --publish_dir)
  auto r = testing::StartService(rollout, "services/rollout/rlfleet-rollout", {"--threads=1", "--publish_dir=" + dir});
  auto w = testing::StartService(weights, "services/weights/rlfleet-weights", {"--publish_dir=" + dir});
  ASSERT_TRUE(t.ok() && r.ok() && w.ok()) << trainer.output() << rollout.output() << weights.output();

  // The trainer hands over a version: a file and its digest.
  v1::PublishWeightsResponse published;
  ASSERT_TRUE(Stub<v1::TrainerService>(*t)->PublishWeights(Context().get(), {}, &published).ok());
  ASSERT_EQ(published.location().digest().algorithm(), v1::DIGEST_ALGORITHM_XXHASH64);
  auto service = Stub<v1::WeightsService>(*w);
  v1::PublishVersionRequest publish;
  *publish.mutable_manifest() = published.manifest();
  *publish.add_sources()->add_shards()->mutable_location() = published.location();
  v1::PublishVersionResponse accepted;
  grpc::Status s = service->PublishVersion(Context().get(), publish, &accepted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(accepted.bytes_read(), published.location().length_bytes());
  // A tampered digest is refused.
  v1::PublishVersionRequest tampered = publish;
  tampered.mutable_manifest()->mutable_version()->set_version(published.manifest().version().version() + 1);
  tampered.mutable_sources(0)->mutable_shards(0)->mutable_location()->mutable_digest()->set_value(1);
  EXPECT_EQ(service->PublishVersion(Context().get(), tampered, &accepted).error_code(), grpc::StatusCode::DATA_LOSS);

  for (const auto& [id, address] :
       std::vector<std::pair<std::string, std::string>>{{"live", *r}, {"gone", "127.0.0.1:1"}}) {
    v1::RegisterDestinationRequest reg;
    reg.set_replica_id(id);
    reg.set_grpc_address(address);
    v1::RegisterDestinationResponse out;
    ASSERT_TRUE(service->RegisterDestination(Context().get(), reg, &out).ok());
  }
  // The replica pulls the version from the weights service's memory (UCX): the
  // trainer's file is not needed any more.
  ASSERT_EQ(std::remove(published.location().segment().worker_address().c_str()), 0);
  v1::SyncVersionRequest sync;
  sync.set_replica_id("live");
  sync.set_commit(true);
  v1::SyncVersionResponse synced;
  s = service->SyncVersion(Context().get(), sync, &synced);
  ASSERT_TRUE(s.ok()) << s.error_message() << rollout.output();
  EXPECT_EQ(synced.status().phase(), v1::SYNC_PHASE_INSTALLED);
  EXPECT_EQ(synced.status().version(), published.manifest().version().version());
  EXPECT_GT(synced.status().transfer_us(), 0);
  v1::GetInfoResponse info;
  ASSERT_TRUE(Stub<v1::RolloutService>(*r)->GetInfo(Context().get(), {}, &info).ok());
  EXPECT_EQ(info.installed_version().version(), published.manifest().version().version());

  sync.set_replica_id("gone");
  sync.set_timeout_ms(3000);
  const absl::Time start = absl::Now();
  s = service->SyncVersion(Context().get(), sync, &synced);
  EXPECT_FALSE(s.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  v1::GetSyncStatusRequest ask;
  v1::GetSyncStatusResponse status;
  ASSERT_TRUE(service->GetSyncStatus(Context().get(), ask, &status).ok());
  ASSERT_EQ(status.destinations_size(), 2);
  for (const auto& d : status.destinations()) {
    EXPECT_EQ(d.phase(), d.replica_id() == "live" ? v1::SYNC_PHASE_INSTALLED : v1::SYNC_PHASE_FAILED) << d.replica_id();
  }
  for (Subprocess* p : {&trainer, &rollout, &weights}) {
    ASSERT_TRUE(p->Signal(SIGTERM).ok());
    EXPECT_TRUE(p->Wait(absl::Seconds(30)).ok());
  }
}

// A trainer with no publish directory keeps its versions in memory on its data plane:
// rlfleet-weights pulls the version from there (digest checked) and the replica from
// rlfleet-weights; no file is written anywhere.
TEST(WeightsService, TheTrainersVersionTravelsFromItsMemoryWithNoFile) {
  Subprocess trainer, rollout, weights;
  auto t = testing::StartService(trainer, "services/trainer/rlfleet-trainer", {"--threads=1"});
  auto r = testing::StartService(rollout, "services/rollout/rlfleet-rollout", {"--threads=1"});
  auto w = testing::StartService(weights, "services/weights/rlfleet-weights", {});
  ASSERT_TRUE(t.ok() && r.ok() && w.ok()) << trainer.output() << rollout.output() << weights.output();
  v1::PublishWeightsResponse published;
  grpc::Status s = Stub<v1::TrainerService>(*t)->PublishWeights(Context().get(), {}, &published);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(published.location().segment().backend(), v1::TRANSFER_BACKEND_UCX);
  EXPECT_EQ(published.location().digest().algorithm(), v1::DIGEST_ALGORITHM_XXHASH64);
  auto service = Stub<v1::WeightsService>(*w);
  v1::PublishVersionRequest publish;
  *publish.mutable_manifest() = published.manifest();
  *publish.add_sources()->add_shards()->mutable_location() = published.location();
  publish.set_trainer_pause_us(static_cast<int64_t>(published.elapsed_ms() * 1000));
  // A wrong digest is refused after the pull.
  v1::PublishVersionRequest tampered = publish;
  tampered.mutable_sources(0)->mutable_shards(0)->mutable_location()->mutable_digest()->set_value(1);
  v1::PublishVersionResponse accepted;
  EXPECT_EQ(service->PublishVersion(Context().get(), tampered, &accepted).error_code(), grpc::StatusCode::DATA_LOSS);
  s = service->PublishVersion(Context().get(), publish, &accepted);
  ASSERT_TRUE(s.ok()) << s.error_message() << weights.output();
  EXPECT_EQ(accepted.bytes_read(), published.location().length_bytes());
  Register(*service, "r", *r);
  // The trainer can go: the version is the weights service's now.
  ASSERT_TRUE(trainer.Signal(SIGKILL).ok());
  ASSERT_TRUE(trainer.Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(SyncAndInstall(*service, "r").phase(), v1::SYNC_PHASE_INSTALLED);
  v1::GetInfoResponse info;
  ASSERT_TRUE(Stub<v1::RolloutService>(*r)->GetInfo(Context().get(), {}, &info).ok());
  EXPECT_EQ(info.installed_version().version(), published.manifest().version().version());
  // The round's phases: the trainer's pause, this service's pull, the replica's transfer.
  v1::GetSyncStatusResponse round;
  ASSERT_TRUE(service->GetSyncStatus(Context().get(), {}, &round).ok());
  EXPECT_EQ(round.version(), published.manifest().version().version());
  EXPECT_GT(round.trainer_pause_us(), 0);
  EXPECT_GT(round.publish_read_us(), 0);
  ASSERT_EQ(round.destinations_size(), 1);
  EXPECT_GT(round.destinations(0).transfer_us(), 0);
  for (Subprocess* p : {&rollout, &weights}) {
    ASSERT_TRUE(p->Signal(SIGTERM).ok());
    EXPECT_TRUE(p->Wait(absl::Seconds(30)).ok());
  }
}

// A trainer started with --weights hands every version to rlfleet-weights itself: an
// orchestrator calls PublishWeights and the version is there (and the same version
// handed on again, as the controller does, is already published).
TEST(WeightsService, ATrainerWithWeightsHandsItsVersionsOnItself) {
  Subprocess trainer, rollout, weights;
  auto w = testing::StartService(weights, "services/weights/rlfleet-weights", {});
  ASSERT_TRUE(w.ok()) << weights.output();
  auto t = testing::StartService(trainer, "services/trainer/rlfleet-trainer", {"--threads=1", "--weights=" + *w});
  auto r = testing::StartService(rollout, "services/rollout/rlfleet-rollout", {"--threads=1"});
  ASSERT_TRUE(t.ok() && r.ok()) << trainer.output() << rollout.output();
  v1::PublishWeightsResponse published;
  grpc::Status s = Stub<v1::TrainerService>(*t)->PublishWeights(Context().get(), {}, &published);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto service = Stub<v1::WeightsService>(*w);
  v1::GetSyncStatusRequest ask;
  ask.set_version(published.manifest().version().version());
  v1::GetSyncStatusResponse round;
  s = service->GetSyncStatus(Context().get(), ask, &round);
  ASSERT_TRUE(s.ok()) << s.error_message();  // (NOT_FOUND if it had not been handed on)
  EXPECT_GT(round.trainer_pause_us(), 0);
  v1::PublishVersionRequest again;
  *again.mutable_manifest() = published.manifest();
  *again.add_sources()->add_shards()->mutable_location() = published.location();
  v1::PublishVersionResponse accepted;
  s = service->PublishVersion(Context().get(), again, &accepted);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(accepted.bytes_read(), 0u);
  Register(*service, "r", *r);
  EXPECT_EQ(SyncAndInstall(*service, "r").phase(), v1::SYNC_PHASE_INSTALLED);
  // With the weights service gone PublishWeights says so (UNAVAILABLE), never hangs.
  ASSERT_TRUE(weights.Signal(SIGKILL).ok());
  ASSERT_TRUE(weights.Wait(absl::Seconds(10)).ok());
  const absl::Time start = absl::Now();
  s = Stub<v1::TrainerService>(*t)->PublishWeights(Context().get(), {}, &published);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  for (Subprocess* p : {&trainer, &rollout}) {
    ASSERT_TRUE(p->Signal(SIGTERM).ok());
    EXPECT_TRUE(p->Wait(absl::Seconds(30)).ok());
  }
}

// The pull relay tree between real processes (--push=false --relay_fanout=1: a chain):
// the first replica pulls the version from rlfleet-weights, the next from the replica
// before it; a relay killed with -9 is replaced by rlfleet-weights for the replica it
// would have fed.
TEST(WeightsService, ReplicasRelayTheVersionAndADeadRelayIsReplaced) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/relayed";
  Subprocess trainer, weights;
  Subprocess rollouts[3];
  auto t = testing::StartService(trainer, "services/trainer/rlfleet-trainer", {"--publish_dir=" + dir, "--threads=1"});
  auto w = testing::StartService(weights, "services/weights/rlfleet-weights",
                                 {"--relay_fanout=1", "--push=false", "--publish_dir=" + dir});
  ASSERT_TRUE(t.ok() && w.ok()) << trainer.output() << weights.output();
  auto service = Stub<v1::WeightsService>(*w);
  const std::vector<std::string> addresses = StartReplicas(rollouts, 3, *service);
  ASSERT_EQ(addresses.size(), 3u);
  v1::PublishWeightsResponse published;
  ASSERT_TRUE(Stub<v1::TrainerService>(*t)->PublishWeights(Context().get(), {}, &published).ok());
  v1::PublishVersionRequest publish;
  *publish.mutable_manifest() = published.manifest();
  *publish.add_sources()->add_shards()->mutable_location() = published.location();
  v1::PublishVersionResponse accepted;
  ASSERT_TRUE(service->PublishVersion(Context().get(), publish, &accepted).ok());
  auto sync = [&](const std::string& id) { return SyncAndInstall(*service, id); };
  EXPECT_EQ(sync("r0").relayed_from(), "");
  // r0 dies holding the only relay copy: r1 gets the version from rlfleet-weights.
  ASSERT_TRUE(rollouts[0].Signal(SIGKILL).ok());
  ASSERT_TRUE(rollouts[0].Wait(absl::Seconds(10)).ok());
  const absl::Time start = absl::Now();
  const v1::DestinationSyncStatus second = sync("r1");
  EXPECT_EQ(second.phase(), v1::SYNC_PHASE_INSTALLED);
  EXPECT_EQ(second.relayed_from(), "");
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  // r2 gets it from r1, replica to replica.
  const v1::DestinationSyncStatus third = sync("r2");
  EXPECT_EQ(third.phase(), v1::SYNC_PHASE_INSTALLED);
  EXPECT_EQ(third.relayed_from(), "r1");
  for (int i = 1; i < 3; ++i) {
    v1::GetInfoResponse info;
    ASSERT_TRUE(Stub<v1::RolloutService>(addresses[i])->GetInfo(Context().get(), {}, &info).ok());
    EXPECT_EQ(info.installed_version().version(), published.manifest().version().version()) << "r" << i;
  }
  for (Subprocess* p : {&trainer, &weights, &rollouts[1], &rollouts[2]}) {
    ASSERT_TRUE(p->Signal(SIGTERM).ok());
    EXPECT_TRUE(p->Wait(absl::Seconds(30)).ok());
  }
}

// A run driven by the controller publishes every version through the weights service:
// the replica ends on the run's last version, installed by rlfleet-weights.
TEST(WeightsService, AControllerRunPublishesThroughIt) {
  const std::string tmp = std::getenv("TEST_TMPDIR");
  const std::vector<std::string> model = {"--d_model=32", "--n_layers=2", "--n_heads=4", "--threads=1"};
  Subprocess reward, buffer, trainer, rollout, weights, controller;
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), model.begin(), model.end());
    return flags;
  };
  auto rw = testing::StartService(reward, "services/reward/rlfleet-reward", {});
  auto b = testing::StartService(buffer, "services/buffer/rlfleet-buffer", {"--data_plane=none"});
  ASSERT_TRUE(rw.ok() && b.ok());
  auto t = testing::StartService(trainer, "services/trainer/rlfleet-trainer",
                                 with({"--buffer=" + *b, "--publish_dir=" + tmp + "/run-weights"}));
  auto r = testing::StartService(rollout, "services/rollout/rlfleet-rollout",
                                 with({"--publish_dir=" + tmp + "/run-weights"}));
  auto w =
      testing::StartService(weights, "services/weights/rlfleet-weights", {"--publish_dir=" + tmp + "/run-weights"});
  ASSERT_TRUE(t.ok() && r.ok() && w.ok());
  auto c = testing::StartService(controller, "services/controller/rlfleet-controller",
                                 {"--rollout=" + *r, "--reward=" + *rw, "--buffer=" + *b, "--trainer=" + *t,
                                  "--weights=" + *w, "--runs_dir=" + tmp + "/runs"});
  ASSERT_TRUE(c.ok()) << controller.output();
  Subprocess run;
  ASSERT_TRUE(run.Start({testing::RunfilePath("services/controller/rlfleet"), "run", "--controller=" + *c, "--steps=3",
                         "--eval_every=1", "--loop_prompts=8", "--loop_samples=8", "--max_len=3"})
                  .ok());
  // (8 prompts x 8 samples: with 4 x 4 an untrained policy sometimes gave every sample
  // of all 3 steps the same reward, and a run with nothing to learn fails.)
  auto done = run.Wait(absl::Seconds(180));
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(WEXITSTATUS(*done), 0) << run.output() << controller.output();
  // Every version the replica serves came through rlfleet-weights: its latest version's
  // status says the replica installed it, and the replica serves that version.
  v1::GetSyncStatusRequest ask;
  ask.set_replica_id(*r);
  v1::GetSyncStatusResponse status;
  grpc::Status s = Stub<v1::WeightsService>(*w)->GetSyncStatus(Context().get(), ask, &status);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(status.destinations_size(), 1);
  EXPECT_EQ(status.destinations(0).phase(), v1::SYNC_PHASE_INSTALLED);
  v1::GetInfoResponse info;
  ASSERT_TRUE(Stub<v1::RolloutService>(*r)->GetInfo(Context().get(), {}, &info).ok());
  EXPECT_EQ(info.installed_version().version(), status.destinations(0).version());
  EXPECT_GE(info.installed_version().version(), 1u);
  for (Subprocess* p : {&controller, &weights, &rollout, &trainer, &buffer, &reward}) {
    ASSERT_TRUE(p->Signal(SIGTERM).ok());
    EXPECT_TRUE(p->Wait(absl::Seconds(30)).ok());
  }
}

// Push between real processes (rlfleet-weights --relay_fanout=1, push on by default):
// one SyncVersion for every replica pushes the version through the resharding executor
// along a chain (each replica relaying every chunk to the next as it arrives, over UCX
// shared memory); every replica serves it. With a replica killed with -9, the next
// version reaches the others, and only the dead one is FAILED, within the deadline.
TEST(WeightsService, OneSyncPushesTheVersionAlongAChainOfReplicas) {
  Subprocess trainer, weights;
  Subprocess rollouts[3];
  auto t = testing::StartService(trainer, "services/trainer/rlfleet-trainer", {"--threads=1"});
  auto w = testing::StartService(weights, "services/weights/rlfleet-weights", {"--relay_fanout=1"});
  ASSERT_TRUE(t.ok() && w.ok()) << trainer.output() << weights.output();
  auto service = Stub<v1::WeightsService>(*w);
  const std::vector<std::string> addresses = StartReplicas(rollouts, 3, *service);
  ASSERT_EQ(addresses.size(), 3u);
  v1::PublishWeightsResponse published;
  ASSERT_TRUE(Stub<v1::TrainerService>(*t)->PublishWeights(Context().get(), {}, &published).ok());
  auto publish = [&](uint64_t version) {
    v1::PublishVersionRequest request;
    *request.mutable_manifest() = published.manifest();
    request.mutable_manifest()->mutable_version()->set_version(version);
    *request.add_sources()->add_shards()->mutable_location() = published.location();
    v1::PublishVersionResponse accepted;
    grpc::Status s = service->PublishVersion(Context().get(), request, &accepted);
    EXPECT_TRUE(s.ok()) << s.error_message();
  };
  auto sync_all = [&] {
    v1::SyncVersionRequest sync;  // (no replica_id: every destination)
    sync.set_commit(true);
    sync.set_timeout_ms(60000);
    v1::SyncVersionResponse synced;
    grpc::Status s = service->SyncVersion(Context().get(), sync, &synced);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::map<std::string, v1::DestinationSyncStatus> out;
    for (const auto& d : synced.destinations()) out[d.replica_id()] = d;
    return out;
  };
  const uint64_t first = published.manifest().version().version();
  publish(first);
  auto status = sync_all();
  ASSERT_EQ(status.size(), 3u);
  const std::map<std::string, std::string> parent = {{"r0", ""}, {"r1", "r0"}, {"r2", "r1"}};
  for (const auto& [id, s] : status) {
    EXPECT_EQ(s.phase(), v1::SYNC_PHASE_INSTALLED) << id << ": " << s.error() << weights.output();
    EXPECT_TRUE(s.pushed()) << id << weights.output();
    EXPECT_EQ(s.relayed_from(), parent.at(id)) << id;
    EXPECT_GT(s.transfer_us(), 0) << id;
  }
  for (int i = 0; i < 3; ++i) {
    v1::GetInfoResponse info;
    ASSERT_TRUE(Stub<v1::RolloutService>(addresses[i])->GetInfo(Context().get(), {}, &info).ok());
    EXPECT_EQ(info.installed_version().version(), first) << "r" << i;
    EXPECT_FALSE(info.data_plane().worker_address().empty()) << "r" << i;
  }
  // r1 dies: the next version goes to r0 and r2; r1 is FAILED.
  ASSERT_TRUE(rollouts[1].Signal(SIGKILL).ok());
  ASSERT_TRUE(rollouts[1].Wait(absl::Seconds(10)).ok());
  publish(first + 1);
  const absl::Time start = absl::Now();
  status = sync_all();
  EXPECT_LT(absl::Now() - start, absl::Seconds(45));
  EXPECT_EQ(status["r1"].phase(), v1::SYNC_PHASE_FAILED);
  for (const std::string id : {"r0", "r2"}) {
    EXPECT_EQ(status[id].phase(), v1::SYNC_PHASE_INSTALLED) << id << ": " << status[id].error();
    EXPECT_EQ(status[id].version(), first + 1) << id;
  }
  v1::GetInfoResponse info;
  ASSERT_TRUE(Stub<v1::RolloutService>(addresses[2])->GetInfo(Context().get(), {}, &info).ok());
  EXPECT_EQ(info.installed_version().version(), first + 1);
  for (Subprocess* p : {&trainer, &weights, &rollouts[0], &rollouts[2]}) {
    ASSERT_TRUE(p->Signal(SIGTERM).ok());
    EXPECT_TRUE(p->Wait(absl::Seconds(30)).ok());
  }
}

}  // namespace
}  // namespace rlfleet

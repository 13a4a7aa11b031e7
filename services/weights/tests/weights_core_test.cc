// WeightsCore over fake destinations: a version is read and its digest checked before
// it is published; a round installs it on every live replica while a dead one and a
// stalled one are dropped at their deadline, each with its reason.
#include "services/weights/weights_core.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "libs/common/checksum.h"
#include "libs/model/safetensors.h"
#include "libs/reshard/round.h"
#include "libs/transport/descriptor_fetcher.h"
#include "libs/transport/loopback/loopback_transport.h"
#include "services/weights/tests/fake_trainer.h"

namespace rlfleet::weights {
namespace {

class FakeDestination : public Destination {
 public:
  enum class Kind { kHealthy, kDead, kStalled };
  explicit FakeDestination(Kind kind) : kind_(kind) {}
  absl::StatusOr<v1::CommitWeightsResponse> Install(const v1::PrepareWeightsRequest& request,
                                                    absl::Time deadline) override {
    last_ = request;
    if (kind_ == Kind::kDead) return absl::UnavailableError("connection refused");
    if (kind_ == Kind::kStalled) {
      never_.WaitForNotificationWithDeadline(deadline);
      return absl::DeadlineExceededError("replica did not answer");
    }
    v1::CommitWeightsResponse r;
    *r.mutable_installed_version() = request.manifest().version();
    r.set_install_us(2000);
    r.set_pull_us(1500);
    r.set_pause_us(3000);
    return r;
  }
  v1::PrepareWeightsRequest last_;

 private:
  const Kind kind_;
  absl::Notification never_;
};

struct Fixture {
  Fixture()
      : core([this](const std::string& address) -> std::unique_ptr<Destination> {
          auto d = std::make_unique<FakeDestination>(address == "dead:1"      ? FakeDestination::Kind::kDead
                                                     : address == "stalled:1" ? FakeDestination::Kind::kStalled
                                                                              : FakeDestination::Kind::kHealthy);
          made[address] = d.get();
          return d;
        }) {
    core.SetFileRoot(std::getenv("TEST_TMPDIR"));  // (the trainer's --publish_dir)
  }
  std::map<std::string, FakeDestination*> made;
  WeightsCore core;
};

// The request that publishes `bytes`, the file at `path`, as `version`.
v1::PublishVersionRequest PublishFile(uint64_t version, const std::string& path, const std::string& bytes,
                                      uint64_t digest_xor = 0) {
  v1::PublishVersionRequest r;
  r.mutable_manifest()->mutable_version()->set_version(version);
  v1::TransferDescriptor* where = r.add_sources()->add_shards()->mutable_location();
  where->mutable_segment()->set_backend(v1::TRANSFER_BACKEND_FILE);
  where->mutable_segment()->set_worker_address(path);
  where->set_length_bytes(bytes.size());
  where->mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
  where->mutable_digest()->set_value(common::Xxh64(bytes) ^ digest_xor);
  return r;
}

// A version file and the request that publishes it.
v1::PublishVersionRequest Publish(uint64_t version, const std::string& path, uint64_t digest_xor = 0) {
  const std::string bytes(4096 + version, static_cast<char>('a' + version));
  std::ofstream(path, std::ios::binary) << bytes;
  return PublishFile(version, path, bytes, digest_xor);
}

TEST(WeightsCore, AVersionIsVerifiedBeforeItIsPublished) {
  Fixture f;
  const std::string dir = std::getenv("TEST_TMPDIR");
  v1::PublishVersionResponse out;
  EXPECT_EQ(f.core.PublishVersion(Publish(1, dir + "/v1", /*digest_xor=*/1), &out).code(), absl::StatusCode::kDataLoss);
  v1::PublishVersionRequest two_sources = Publish(1, dir + "/v1");
  *two_sources.add_sources() = two_sources.sources(0);
  auto bad = f.core.PublishVersion(two_sources, &out);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.message(), "sources:")) << bad;
  v1::PublishVersionRequest no_digest = Publish(1, dir + "/v1");
  no_digest.mutable_sources(0)->mutable_shards(0)->mutable_location()->clear_digest();
  EXPECT_TRUE(absl::StrContains(f.core.PublishVersion(no_digest, &out).message(), "digest: required"));
  ASSERT_TRUE(f.core.PublishVersion(Publish(2, dir + "/v2"), &out).ok());
  EXPECT_EQ(out.bytes_read(), 4098u);
  // The same version again: already published (nothing read) if the digest is the
  // same, refused if it is not; an older one is refused.
  v1::PublishVersionResponse again;
  ASSERT_TRUE(f.core.PublishVersion(Publish(2, dir + "/v2"), &again).ok());
  EXPECT_EQ(again.bytes_read(), 0u);
  v1::PublishVersionRequest changed = Publish(2, dir + "/v2");
  changed.mutable_sources(0)->mutable_shards(0)->mutable_location()->mutable_digest()->set_value(12345);
  EXPECT_EQ(f.core.PublishVersion(changed, &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.core.PublishVersion(Publish(1, dir + "/v1"), &out).code(), absl::StatusCode::kFailedPrecondition);
  // A rejected version left nothing to sync.
  v1::RegisterDestinationRequest reg;
  reg.set_replica_id("r");
  reg.set_grpc_address("healthy:1");
  v1::RegisterDestinationResponse registered;
  ASSERT_TRUE(f.core.RegisterDestination(reg, &registered).ok());
  EXPECT_EQ(registered.latest_version().version(), 2u);
  v1::SyncVersionRequest sync;
  sync.set_commit(true);
  sync.set_replica_id("r");
  sync.set_version(1);
  v1::SyncVersionResponse synced;
  EXPECT_EQ(f.core.SyncVersion(sync, &synced).code(), absl::StatusCode::kNotFound);
}

TEST(WeightsCore, ARoundDropsADeadAndAStalledReplicaAtTheirDeadlineAndTheOthersInstall) {
  Fixture f;
  for (const auto& [id, address] : std::vector<std::pair<std::string, std::string>>{
           {"a", "healthy:1"}, {"b", "healthy:2"}, {"dead", "dead:1"}, {"stalled", "stalled:1"}}) {
    v1::RegisterDestinationRequest reg;
    reg.set_replica_id(id);
    reg.set_grpc_address(address);
    v1::RegisterDestinationResponse out;
    ASSERT_TRUE(f.core.RegisterDestination(reg, &out).ok());
  }
  v1::RegisterDestinationRequest nameless;
  nameless.set_grpc_address("x:1");
  v1::RegisterDestinationResponse ignored;
  EXPECT_TRUE(absl::StrContains(f.core.RegisterDestination(nameless, &ignored).message(), "replica_id"));
  v1::PublishVersionResponse published;
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/v7";
  ASSERT_TRUE(f.core.PublishVersion(Publish(7, path), &published).ok());
  EXPECT_EQ(published.destinations(), 4u);

  const absl::Time start = absl::Now();
  auto round = f.core.SyncAll(0, absl::Milliseconds(500));
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the stalled replica held up the round";
  std::map<std::string, v1::DestinationSyncStatus> by_id;
  for (const auto& s : *round) by_id[s.replica_id()] = s;
  ASSERT_EQ(by_id.size(), 4u);
  for (const char* id : {"a", "b"}) {
    EXPECT_EQ(by_id[id].phase(), v1::SYNC_PHASE_INSTALLED) << id;
    EXPECT_EQ(by_id[id].version(), 7u);
    EXPECT_EQ(by_id[id].bytes_moved(), 4103u);
    EXPECT_EQ(by_id[id].transfer_us(), 1500);  // the replica's pull
    EXPECT_EQ(by_id[id].install_us(), 2000);
    EXPECT_GT(by_id[id].round_trip_us(), 0);
    EXPECT_EQ(by_id[id].pause_us(), 3000);
    EXPECT_GT(by_id[id].throughput_gb_per_s(), 0);
  }
  EXPECT_EQ(by_id["dead"].phase(), v1::SYNC_PHASE_FAILED);
  EXPECT_TRUE(absl::StrContains(by_id["dead"].error(), "UNAVAILABLE")) << by_id["dead"].error();
  EXPECT_EQ(by_id["stalled"].phase(), v1::SYNC_PHASE_FAILED);
  EXPECT_TRUE(absl::StrContains(by_id["stalled"].error(), "DEADLINE_EXCEEDED")) << by_id["stalled"].error();
  // What a replica was asked to install: the verified file, with its digest.
  const v1::PrepareWeightsRequest& asked = f.made["healthy:1"]->last_;
  EXPECT_EQ(asked.manifest().version().version(), 7u);
  ASSERT_EQ(asked.chunks_size(), 1);
  EXPECT_EQ(asked.chunks(0).source().segment().worker_address(), path);
  // The status RPC says the same.
  v1::GetSyncStatusRequest ask;
  ask.set_replica_id("stalled");
  v1::GetSyncStatusResponse status;
  ASSERT_TRUE(f.core.GetSyncStatus(ask, &status).ok());
  ASSERT_EQ(status.destinations_size(), 1);
  EXPECT_EQ(status.destinations(0).phase(), v1::SYNC_PHASE_FAILED);
  ask.set_replica_id("nobody");
  EXPECT_EQ(f.core.GetSyncStatus(ask, &status).code(), absl::StatusCode::kNotFound);
}

// With a data plane, replicas are sent the version in the service's memory: a
// destination that pulls it over its own transport gets the file's exact bytes.
// A replica that pulls the version from its memory descriptor (over the loopback data
// plane) into `out`.
struct Pulling : Destination {
  transport::DescriptorFetcher* fetcher;
  std::string* out;
  absl::StatusOr<v1::CommitWeightsResponse> Install(const v1::PrepareWeightsRequest& request,
                                                    absl::Time deadline) override {
    EXPECT_EQ(request.chunks(0).source().segment().backend(), v1::TRANSFER_BACKEND_LOOPBACK);
    absl::StatusOr<std::string> bytes = fetcher->Fetch(request.chunks(0).source(), deadline);
    if (!bytes.ok()) return bytes.status();
    *out = *bytes;
    return v1::CommitWeightsResponse();
  }
};

DestinationFactory PullInto(transport::DescriptorFetcher* fetcher, std::string* out) {
  return [fetcher, out](const std::string&) -> std::unique_ptr<Destination> {
    auto d = std::make_unique<Pulling>();
    d->fetcher = fetcher;
    d->out = out;
    return d;
  };
}

TEST(WeightsCore, VersionsAreServedFromMemoryOverTheDataPlane) {
  auto service_side = transport::LoopbackTransport::Create();
  auto replica_side = transport::LoopbackTransport::Create();
  transport::DescriptorFetcher fetcher(replica_side.get());
  std::string pulled;
  WeightsCore core(PullInto(&fetcher, &pulled), service_side.get());
  core.SetFileRoot(std::getenv("TEST_TMPDIR"));
  v1::RegisterDestinationRequest reg;
  reg.set_replica_id("r");
  reg.set_grpc_address("r:1");
  v1::RegisterDestinationResponse registered;
  ASSERT_TRUE(core.RegisterDestination(reg, &registered).ok());
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/v3";
  v1::PublishVersionResponse published;
  ASSERT_TRUE(core.PublishVersion(Publish(3, path), &published).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  v1::SyncVersionRequest sync;
  sync.set_commit(true);
  sync.set_replica_id("r");
  v1::SyncVersionResponse synced;
  ASSERT_TRUE(core.SyncVersion(sync, &synced).ok());
  EXPECT_EQ(pulled, file);
}

// A replica on `host_id` and `device` that reports them in its info, and installs the
// trainer's GPU copy when it may (a CUDA device of the copy's host; recorded, nothing
// read) or else pulls the chunk over its own loopback transport.
struct GpuOrCpuReplica : Destination {
  GpuOrCpuReplica(std::string host_id, std::string device) : host_id(std::move(host_id)), device(std::move(device)) {}
  absl::StatusOr<v1::GetInfoResponse> Info(absl::Time) override {
    v1::GetInfoResponse info;
    info.set_host_id(host_id);
    info.set_device(device);
    return info;
  }
  absl::StatusOr<v1::CommitWeightsResponse> Install(const v1::PrepareWeightsRequest& request,
                                                    absl::Time deadline) override {
    requests.push_back(request);
    v1::CommitWeightsResponse r;
    r.set_from_device_image(request.device_image().host_id() == host_id && absl::StartsWith(device, "cuda"));
    if (!r.from_device_image()) {
      absl::StatusOr<std::string> bytes =
          transport::DescriptorFetcher(transport.get()).Fetch(request.chunks(0).source(), deadline);
      if (!bytes.ok()) return bytes.status();
      pulled = *bytes;
    }
    *r.mutable_installed_version() = request.manifest().version();
    return r;
  }
  const std::string host_id, device;
  std::unique_ptr<transport::Transport> transport = transport::LoopbackTransport::Create();
  std::vector<v1::PrepareWeightsRequest> requests;
  std::string pulled;
};

// A version published with the trainer's GPU copy is not pulled at publish: a sync to a
// CUDA replica of the trainer's host moves no host bytes (its fallback chunk is the
// trainer's memory); the first replica that needs the bytes (a CPU one) has them pulled
// then, from the trainer, and gets them from this service; once the trainer has let a
// version go, that pull fails by name and the replica's status says so. With the host
// copy always kept (--host_copy=always) the version is pulled at publish.
TEST(WeightsCore, AVersionWithTheTrainersGpuCopyIsPulledHereOnlyForAReplicaThatNeedsItsBytes) {
  auto service_side = transport::LoopbackTransport::Create();
  std::map<std::string, GpuOrCpuReplica*> made;
  WeightsCore core(
      [&made](const std::string& address) -> std::unique_ptr<Destination> {
        auto d = std::make_unique<GpuOrCpuReplica>("host-a", absl::StartsWith(address, "gpu") ? "cuda:0" : "cpu");
        made[address] = d.get();
        return d;
      },
      service_side.get());
  core.EnablePush(true);
  std::vector<std::string> log;
  core.SetLogger([&log](const std::string& line) { log.push_back(line); });
  FakeTrainer trainer;
  std::map<uint64_t, std::string>& images = trainer.images;
  auto publish = [&](uint64_t version) {
    v1::PublishVersionResponse out;
    EXPECT_TRUE(core.PublishVersion(trainer.Publish(version, 1024, "host-a"), &out).ok());
    return out;
  };
  auto sync = [&](uint64_t version, const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
      v1::RegisterDestinationRequest reg;
      reg.set_replica_id(id);
      reg.set_grpc_address(id + ":1");
      v1::RegisterDestinationResponse registered;
      EXPECT_TRUE(core.RegisterDestination(reg, &registered).ok());
    }
    return *core.SyncSome(version, ids, absl::Seconds(20));
  };
  EXPECT_EQ(publish(1).bytes_read(), 0u);  // (nothing pulled at publish)
  std::vector<v1::DestinationSyncStatus> done = sync(1, {"gpu"});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].phase(), v1::SYNC_PHASE_INSTALLED) << done[0].error();
  EXPECT_TRUE(done[0].from_device_image());
  ASSERT_EQ(made["gpu:1"]->requests.size(), 1u);
  const v1::PrepareWeightsRequest& to_gpu = made["gpu:1"]->requests[0];
  EXPECT_EQ(to_gpu.device_image().host_id(), "host-a");
  // Its fallback chunk is the trainer's memory, not a copy here.
  EXPECT_EQ(to_gpu.chunks(0).source().segment().worker_address(),
            trainer.transport->Describe(trainer.handles[1])->worker_address());
  EXPECT_FALSE(to_gpu.serve_relay());
  for (const std::string& line : log) EXPECT_FALSE(absl::StrContains(line, "pulled from the trainer")) << line;

  // A CPU replica needs the bytes: pulled here now, and served from here.
  done = sync(1, {"cpu", "gpu"});
  ASSERT_EQ(done.size(), 2u);
  for (const auto& d : done) EXPECT_EQ(d.phase(), v1::SYNC_PHASE_INSTALLED) << d.replica_id() << ": " << d.error();
  EXPECT_FALSE(done[0].from_device_image());  // (cpu: sorted first)
  EXPECT_EQ(made["cpu:1"]->pulled, images[1]);
  ASSERT_FALSE(made["cpu:1"]->requests.empty());
  EXPECT_NE(made["cpu:1"]->requests.back().chunks(0).source().segment().worker_address(),
            trainer.transport->Describe(trainer.handles[1])->worker_address());
  EXPECT_EQ(
      std::count_if(log.begin(), log.end(),
                    [](const std::string& l) { return absl::StrContains(l, "host copy pulled from the trainer"); }),
      1);

  // Version 2: the trainer lets it go before anyone needs its bytes; the CPU replica's
  // sync fails naming the deferred host copy, the GPU one installs.
  publish(2);
  ASSERT_TRUE(trainer.transport->DeregisterMemory(trainer.handles[2]).ok());
  done = sync(2, {"cpu", "gpu"});
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].replica_id(), "cpu");
  EXPECT_EQ(done[0].phase(), v1::SYNC_PHASE_FAILED);
  EXPECT_TRUE(absl::StrContains(done[0].error(), "host copy")) << done[0].error();
  EXPECT_EQ(done[1].phase(), v1::SYNC_PHASE_INSTALLED) << done[1].error();

  // A plan needs the version's tensors: asked for one of a deferred version, the
  // service pulls its bytes then.
  publish(3);
  {
    v1::RegisterDestinationRequest reg;
    reg.set_replica_id("planned");
    reg.set_grpc_address("cpu-planned:1");
    v1::RegisterDestinationResponse registered;
    ASSERT_TRUE(core.RegisterDestination(reg, &registered).ok());
    v1::GetPlanRequest ask;
    ask.set_version(3);
    ask.set_replica_id("planned");
    v1::GetPlanResponse plan;
    absl::Status planned = core.GetPlan(ask, &plan);
    EXPECT_TRUE(planned.ok()) << planned;
    v1::UnregisterDestinationRequest gone;
    gone.set_replica_id("planned");
    v1::UnregisterDestinationResponse unregistered;
    ASSERT_TRUE(core.UnregisterDestination(gone, &unregistered).ok());
  }

  // --host_copy=always: pulled at publish.
  core.SetDeferHostCopy(false);
  const uint64_t read_at_publish = publish(4).bytes_read();
  EXPECT_EQ(read_at_publish, images[4].size());
}

// A replica that pulls over its own loopback transport and, when asked, serves its copy.
struct RelayingReplica : Destination {
  std::unique_ptr<transport::Transport> transport = transport::LoopbackTransport::Create();
  std::string copy;
  std::optional<transport::MemoryHandle> served;
  std::string source_address;  // where it pulled from (the descriptor's worker address)
  absl::StatusOr<v1::CommitWeightsResponse> Install(const v1::PrepareWeightsRequest& request,
                                                    absl::Time deadline) override {
    transport::DescriptorFetcher fetcher(transport.get());
    absl::StatusOr<std::string> bytes = fetcher.Fetch(request.chunks(0).source(), deadline);
    if (!bytes.ok()) return bytes.status();
    if (served) (void)transport->DeregisterMemory(*served);
    copy = *bytes;
    v1::CommitWeightsResponse r;
    *r.mutable_installed_version() = request.manifest().version();
    if (request.serve_relay()) {
      served = *transport->RegisterMemory(copy.data(), copy.size(), transport::MemoryKind::kHost, 0);
      v1::TransferDescriptor* out = r.mutable_relay_source();
      *out = request.chunks(0).source();
      *out->mutable_segment() = *transport->Describe(*served);
    }
    return r;
  }
  void MoveOn() {  // (as a replica that died or installed a newer version: its copy is gone)
    if (served) (void)transport->DeregisterMemory(*served);
    served.reset();
  }
};

struct RelayFixture {
  // Replicas r0..r<replicas-1>, each registered with can_relay unless named in no_relay.
  explicit RelayFixture(int fanout, int replicas, std::set<std::string> no_relay = {})
      : core(
            [this](const std::string& address) -> std::unique_ptr<Destination> {
              auto d = std::make_unique<RelayingReplica>();
              made[address] = d.get();
              return d;
            },
            service_side.get(), fanout) {
    core.SetFileRoot(std::getenv("TEST_TMPDIR"));
    for (int i = 0; i < replicas; ++i) {
      v1::RegisterDestinationRequest reg;
      reg.set_replica_id(absl::StrCat("r", i));
      reg.set_grpc_address(absl::StrCat("r", i, ":1"));
      reg.set_can_relay(!no_relay.count(reg.replica_id()));
      v1::RegisterDestinationResponse registered;
      EXPECT_TRUE(core.RegisterDestination(reg, &registered).ok());
    }
    path = std::string(std::getenv("TEST_TMPDIR")) + "/relay-v5";
    v1::PublishVersionResponse published;
    EXPECT_TRUE(core.PublishVersion(Publish(5, path), &published).ok());
    std::ifstream in(path, std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  v1::DestinationSyncStatus Sync(const std::string& id) {
    v1::SyncVersionRequest sync;
    sync.set_commit(true);
    sync.set_replica_id(id);
    sync.set_timeout_ms(20000);
    v1::SyncVersionResponse synced;
    absl::Status s = core.SyncVersion(sync, &synced);
    EXPECT_TRUE(s.ok()) << id << ": " << s;
    return synced.status();
  }
  std::unique_ptr<transport::Transport> service_side = transport::LoopbackTransport::Create();
  std::map<std::string, RelayingReplica*> made;
  WeightsCore core;
  std::string path, file;
};

// Eight replicas syncing at once with fan-out 1: this service sends the version once,
// every replica passes it to at most one other (a chain), and all get every byte.
// A version sharded over two trainer ranks (FSDP flat with an uneven split, TP rows
// and columns, replicated), one descriptor per rank and tensor: pulled shard by shard,
// assembled whole and served as the image a replica installs, byte for byte. What does
// not fit the layout is INVALID_ARGUMENT naming the field; a bad shard digest DATA_LOSS
// naming rank and tensor.
TEST(WeightsCore, AShardedVersionFromTwoTrainerRanksIsAssembledWhole) {
  auto service_side = transport::LoopbackTransport::Create();
  std::vector<std::unique_ptr<transport::LoopbackTransport>> trainers;
  for (int r = 0; r < 2; ++r) trainers.push_back(transport::LoopbackTransport::Create());
  struct Spec {
    std::string name;
    std::vector<int64_t> shape;
    v1::LayoutKind kind;
  };
  const std::vector<Spec> specs = {{"a", {5, 3}, v1::LAYOUT_KIND_FSDP_FLAT},  // 15 elements: 8 + 7 (+1 padding)
                                   {"b", {4, 6}, v1::LAYOUT_KIND_TP_ROW},
                                   {"c", {2, 4}, v1::LAYOUT_KIND_TP_COLUMN},
                                   {"d", {3}, v1::LAYOUT_KIND_REPLICATED}};
  std::map<std::string, std::vector<float>> full;
  float next = 1;
  for (const Spec& sp : specs) {
    int64_t n = 1;
    for (int64_t d : sp.shape) n *= d;
    for (int64_t i = 0; i < n; ++i) full[sp.name].push_back(next++);
  }
  // Each rank's shard of each tensor, as a trainer would hold it.
  std::vector<std::vector<std::string>> shards(2);
  for (int r = 0; r < 2; ++r) {
    for (const Spec& sp : specs) {
      std::string bytes;
      const std::vector<float>& f = full[sp.name];
      const int64_t rows = sp.shape[0], cols = sp.shape.size() > 1 ? sp.shape[1] : 1;
      auto put = [&](float v) { bytes.append(reinterpret_cast<const char*>(&v), 4); };
      if (sp.kind == v1::LAYOUT_KIND_FSDP_FLAT) {
        const size_t per = (f.size() + 1) / 2;
        for (size_t i = r * per; i < (r + 1) * per; ++i) put(i < f.size() ? f[i] : 0.0f);
      } else if (sp.kind == v1::LAYOUT_KIND_TP_ROW) {
        for (int64_t i = r * rows / 2 * cols; i < (r + 1) * rows / 2 * cols; ++i) put(f[i]);
      } else if (sp.kind == v1::LAYOUT_KIND_TP_COLUMN) {
        for (int64_t row = 0; row < rows; ++row) {
          for (int64_t c = r * cols / 2; c < (r + 1) * cols / 2; ++c) put(f[row * cols + c]);
        }
      } else {
        for (float v : f) put(v);
      }
      shards[r].push_back(bytes);
    }
  }
  v1::PublishVersionRequest request;
  request.mutable_manifest()->mutable_version()->set_version(7);
  v1::ShardLayout* layout = request.mutable_manifest()->mutable_layout();
  layout->set_world_size(2);
  for (const Spec& sp : specs) {
    v1::TensorLayout* t = layout->add_tensors();
    t->mutable_spec()->set_name(sp.name);
    t->mutable_spec()->set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t d : sp.shape) t->mutable_spec()->add_shape(d);
    t->set_kind(sp.kind);
    t->set_axis(sp.kind == v1::LAYOUT_KIND_TP_COLUMN ? 1 : 0);
  }
  for (int r = 0; r < 2; ++r) {
    v1::SourceRank* source = request.add_sources();
    source->set_rank(r);
    for (size_t t = 0; t < specs.size(); ++t) {
      auto handle =
          trainers[r]->RegisterMemory(shards[r][t].data(), shards[r][t].size(), transport::MemoryKind::kHost, 0);
      ASSERT_TRUE(handle.ok());
      v1::SourceShard* shard = source->add_shards();
      shard->set_tensor_name(specs[t].name);
      *shard->mutable_location()->mutable_segment() = *trainers[r]->Describe(*handle);
      shard->mutable_location()->set_length_bytes(shards[r][t].size());
      shard->mutable_location()->mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
      shard->mutable_location()->mutable_digest()->set_value(common::Xxh64(shards[r][t]));
    }
  }

  WeightsCore no_plane([](const std::string&) { return std::unique_ptr<Destination>(); });
  v1::PublishVersionResponse published;
  absl::Status s = no_plane.PublishVersion(request, &published);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("data plane"), std::string::npos) << s;

  WeightsCore core([](const std::string&) { return std::unique_ptr<Destination>(); }, service_side.get());
  // What does not fit the layout, named.
  v1::PublishVersionRequest one_rank = request;
  one_rank.mutable_sources()->RemoveLast();
  s = core.PublishVersion(one_rank, &published);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sources: 1 source ranks; the layout has 2"), std::string::npos) << s;
  v1::PublishVersionRequest unknown = request;
  unknown.mutable_sources(1)->mutable_shards(2)->set_tensor_name("zz");
  s = core.PublishVersion(unknown, &published);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sources[1].shards[2].tensor_name: `zz`"), std::string::npos) << s;
  v1::PublishVersionRequest short_shard = request;
  short_shard.mutable_sources(0)->mutable_shards(1)->mutable_location()->set_length_bytes(8);
  s = core.PublishVersion(short_shard, &published);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sources[0].shards[1].location.length_bytes"), std::string::npos) << s;
  v1::PublishVersionRequest bad_digest = request;
  bad_digest.mutable_sources(1)->mutable_shards(0)->mutable_location()->mutable_digest()->set_value(1);
  s = core.PublishVersion(bad_digest, &published);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("rank 1, tensor `a`"), std::string::npos) << s;

  ASSERT_TRUE(core.PublishVersion(request, &published).ok());
  EXPECT_EQ(published.version().version(), 7u);
  // The image served for version 7, pulled as a replica would: every tensor whole.
  auto replica_side = transport::LoopbackTransport::Create();
  transport::DescriptorFetcher fetcher(replica_side.get());
  std::string image;
  WeightsCore serving(PullInto(&fetcher, &image), service_side.get());
  ASSERT_TRUE(serving.PublishVersion(request, &published).ok());
  v1::RegisterDestinationRequest reg;
  reg.set_replica_id("r");
  reg.set_grpc_address("r:1");
  v1::RegisterDestinationResponse registered;
  ASSERT_TRUE(serving.RegisterDestination(reg, &registered).ok());
  v1::SyncVersionRequest sync;
  sync.set_commit(true);
  sync.set_replica_id("r");
  v1::SyncVersionResponse synced;
  ASSERT_TRUE(serving.SyncVersion(sync, &synced).ok()) << synced.status().error();
  auto tensors = model::ParseSafetensors(image, "image");
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  for (const Spec& sp : specs) {
    const model::TensorBlob& blob = (*tensors)[sp.name];
    EXPECT_EQ(blob.shape, sp.shape) << sp.name;
    ASSERT_EQ(blob.bytes.size(), full[sp.name].size() * 4) << sp.name;
    EXPECT_EQ(std::memcmp(blob.bytes.data(), full[sp.name].data(), blob.bytes.size()), 0) << sp.name;
  }
  // The same sharded manifest again is already published.
  EXPECT_TRUE(serving.PublishVersion(request, &published).ok());
}

TEST(WeightsRelay, ParallelSyncsFormAChainAndEveryReplicaGetsEveryByte) {
  RelayFixture f(/*fanout=*/1, /*replicas=*/8);
  std::vector<v1::DestinationSyncStatus> statuses(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) threads.emplace_back([&, i] { statuses[i] = f.Sync(absl::StrCat("r", i)); });
  for (auto& t : threads) t.join();
  std::map<std::string, int> served;  // sender -> replicas it fed
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(statuses[i].phase(), v1::SYNC_PHASE_INSTALLED) << statuses[i].ShortDebugString();
    EXPECT_EQ(f.made[absl::StrCat("r", i, ":1")]->copy, f.file) << "replica " << i;
    ++served[statuses[i].relayed_from()];
  }
  EXPECT_EQ(served[""], 1) << "this service sent the version more than once";
  for (const auto& [sender, n] : served) EXPECT_LE(n, 1) << sender;
}

// A replica registered without can_relay never forwards bytes: it is never the source
// of another replica's pull.
TEST(WeightsRelay, AReplicaThatMayNotRelayIsNeverASource) {
  RelayFixture f(/*fanout=*/1, /*replicas=*/3, /*no_relay=*/{"r0", "r1", "r2"});
  for (const std::string id : {"r0", "r1", "r2"}) {
    const v1::DestinationSyncStatus s = f.Sync(id);
    EXPECT_EQ(s.phase(), v1::SYNC_PHASE_INSTALLED) << id;
    EXPECT_EQ(s.relayed_from(), "") << id << " was fed by a replica that may not relay";
  }
}

// Fan-out 2: the service feeds two, each replica at most two more.
TEST(WeightsRelay, FanoutBoundsWhatEverySenderSends) {
  RelayFixture f(/*fanout=*/2, /*replicas=*/7);
  std::vector<std::thread> threads;
  std::vector<v1::DestinationSyncStatus> statuses(7);
  for (int i = 0; i < 7; ++i) threads.emplace_back([&, i] { statuses[i] = f.Sync(absl::StrCat("r", i)); });
  for (auto& t : threads) t.join();
  std::map<std::string, int> served;
  for (const auto& s : statuses) {
    EXPECT_EQ(s.phase(), v1::SYNC_PHASE_INSTALLED);
    ++served[s.relayed_from()];
  }
  EXPECT_LE(served[""], 2);
  for (const auto& [sender, n] : served) EXPECT_LE(n, 2) << sender;
  EXPECT_GT(served.size(), 1u) << "nothing was relayed";
}

// A relaying replica that is gone (its copy deregistered): the replica it would have fed
// gets the version from this service instead, and the gone one feeds nobody else.
TEST(WeightsRelay, ARelayThatIsGoneIsReplacedByThisService) {
  RelayFixture f(/*fanout=*/1, /*replicas=*/3);
  std::vector<std::string> log;
  f.core.SetLogger([&](const std::string& line) { log.push_back(line); });
  EXPECT_EQ(f.Sync("r0").relayed_from(), "");
  f.made["r0:1"]->MoveOn();
  const v1::DestinationSyncStatus second = f.Sync("r1");
  EXPECT_EQ(second.phase(), v1::SYNC_PHASE_INSTALLED);
  EXPECT_EQ(second.relayed_from(), "");  // r0's relay failed: sent again from here
  EXPECT_EQ(f.made["r1:1"]->copy, f.file);
  const v1::DestinationSyncStatus third = f.Sync("r2");
  EXPECT_EQ(third.relayed_from(), "r1");
  EXPECT_EQ(f.made["r2:1"]->copy, f.file);
  // The log tells the story: who got it from where, and the failed relay.
  ASSERT_EQ(log.size(), 4u) << absl::StrJoin(log, "\n");
  EXPECT_TRUE(absl::StrContains(log[0], "version 5 -> r0 (pulled from here): installed")) << log[0];
  EXPECT_TRUE(absl::StrContains(log[1], "the relay from r0 failed")) << log[1];
  EXPECT_TRUE(absl::StrContains(log[2], "version 5 -> r1 (pulled from here): installed")) << log[2];
  EXPECT_TRUE(absl::StrContains(log[3], "version 5 -> r2 (pulled from r1): installed")) << log[3];
}

// GetPlan: the version's tensors (from its safetensors header) from the trainer's one
// rank to a replica of TP 2 (the matrix by rows, the norm replicated): each TP rank
// gets half the matrix and all of the norm, and the plan moves exactly what is needed.
TEST(WeightsPlan, TheVersionIsPlannedInTheDestinationsLayout) {
  std::map<std::string, model::TensorBlob> tensors;
  tensors["layer.weight"] = {"F32", {64, 32}, std::string(64 * 32 * 4, '\x01')};
  tensors["norm"] = {"F32", {32}, std::string(32 * 4, '\x02')};
  const std::string image = model::SerializeSafetensors(tensors);
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/plan-v7.safetensors";
  std::ofstream(path, std::ios::binary) << image;
  Fixture f;
  v1::PublishVersionResponse published;
  ASSERT_TRUE(f.core.PublishVersion(PublishFile(7, path, image), &published).ok());

  v1::RegisterDestinationRequest tp2;
  tp2.set_replica_id("tp2");
  tp2.set_grpc_address("tp2:1");
  tp2.mutable_layout()->set_world_size(2);
  for (const auto& [name, kind] : std::vector<std::pair<std::string, v1::LayoutKind>>{
           {"layer.weight", v1::LAYOUT_KIND_TP_ROW}, {"norm", v1::LAYOUT_KIND_REPLICATED}}) {
    v1::TensorLayout* t = tp2.mutable_layout()->add_tensors();
    t->mutable_spec()->set_name(name);
    t->set_kind(kind);
  }
  v1::RegisterDestinationResponse registered;
  ASSERT_TRUE(f.core.RegisterDestination(tp2, &registered).ok());
  v1::GetPlanRequest ask;
  ask.set_replica_id("tp2");
  ask.set_include_ranges(true);
  v1::GetPlanResponse plan;
  ASSERT_TRUE(f.core.GetPlan(ask, &plan).ok());
  EXPECT_EQ(plan.version(), 7u);
  ASSERT_EQ(plan.pairs_size(), 2);
  for (const auto& pair : plan.pairs()) {
    EXPECT_EQ(pair.src_rank(), 0u);
    EXPECT_EQ(pair.bytes(), 32u * 32 * 4 + 32 * 4) << "TP rank " << pair.dst_rank();
    EXPECT_EQ(static_cast<int>(pair.range_count()), pair.ranges_size());
  }
  EXPECT_EQ(plan.bytes_needed(), 2 * (32u * 32 * 4 + 32 * 4));
  EXPECT_EQ(plan.bytes_planned(), plan.bytes_needed());

  // With no layout registered the replica holds everything: one pair, the whole model.
  v1::RegisterDestinationRequest whole;
  whole.set_replica_id("whole");
  whole.set_grpc_address("whole:1");
  ASSERT_TRUE(f.core.RegisterDestination(whole, &registered).ok());
  ask.set_replica_id("whole");
  ask.set_include_ranges(false);
  v1::GetPlanResponse all;
  ASSERT_TRUE(f.core.GetPlan(ask, &all).ok());
  ASSERT_EQ(all.pairs_size(), 1);
  EXPECT_EQ(all.pairs(0).bytes(), 64u * 32 * 4 + 32 * 4);
  EXPECT_EQ(all.pairs(0).ranges_size(), 0);

  // Bad asks name the problem.
  ask.set_replica_id("nobody");
  EXPECT_EQ(f.core.GetPlan(ask, &all).code(), absl::StatusCode::kNotFound);
  ask.set_replica_id("tp2");
  ask.set_max_ranges(100001);
  EXPECT_EQ(f.core.GetPlan(ask, &all).code(), absl::StatusCode::kInvalidArgument);
  v1::RegisterDestinationRequest partial = tp2;
  partial.set_replica_id("partial");
  partial.mutable_layout()->mutable_tensors()->RemoveLast();
  ASSERT_TRUE(f.core.RegisterDestination(partial, &registered).ok());
  ask.set_replica_id("partial");
  ask.set_max_ranges(0);
  absl::Status lacking = f.core.GetPlan(ask, &all);
  EXPECT_EQ(lacking.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(lacking.message(), "norm")) << lacking;
}

namespace push {

// A replica with a data plane of its own: told a reshard round, it receives its shard
// (libs/reshard's ShardReceiver) and keeps the tensors; told a pull, it pulls the image.
// `dies` makes it a replica that is gone when the round comes (its transport closed).
struct PushedReplica : Destination {
  std::unique_ptr<transport::LoopbackTransport> transport = transport::LoopbackTransport::Create();
  reshard::ShardReceiver receiver{*transport};
  bool has_data_plane = true;
  bool dies = false;
  uint64_t installed = 0;
  std::map<std::string, std::string> tensors;  // what it installed, pushed
  std::string pulled;                          // or pulled
  int pushes = 0;
  absl::StatusOr<v1::GetInfoResponse> Info(absl::Time) override {
    v1::GetInfoResponse info;
    info.mutable_installed_version()->set_version(installed);
    if (has_data_plane) info.mutable_data_plane()->set_worker_address(transport->LocalAddress());
    return info;
  }
  absl::StatusOr<v1::CommitWeightsResponse> Install(const v1::PrepareWeightsRequest& request,
                                                    absl::Time deadline) override {
    if (dies) {
      transport->Close();
      return absl::UnavailableError("replica gone");
    }
    v1::CommitWeightsResponse r;
    if (request.has_reshard()) {
      ++pushes;
      auto received = receiver.Receive(request.reshard(), deadline);
      if (!received.ok()) return received.status();
      for (size_t t = 0; t < received->plan.tensors.size(); ++t) {
        tensors[received->plan.tensors[t].name] = std::string(received->Part(t));
      }
      r.set_pull_us(absl::ToInt64Microseconds(received->transfer));
    } else {
      transport::DescriptorFetcher fetcher(transport.get());
      absl::StatusOr<std::string> bytes = fetcher.Fetch(request.chunks(0).source(), deadline);
      if (!bytes.ok()) return bytes.status();
      pulled = *bytes;
    }
    installed = request.manifest().version().version();
    *r.mutable_installed_version() = request.manifest().version();
    return r;
  }
};

// The tensors of the version pushed: a few shapes and dtypes (an odd size among them).
std::map<std::string, model::TensorBlob> Tensors() {
  std::map<std::string, model::TensorBlob> out;
  auto fill = [](size_t bytes, char seed) {
    std::string b(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<char>(seed + i * 7 + (i >> 8));
    return b;
  };
  out["embed"] = {"F32", {300, 64}, fill(300 * 64 * 4, 1)};
  out["layer.0.w"] = {"BF16", {63, 17}, fill(63 * 17 * 2, 2)};
  out["layer.0.b"] = {"F32", {17}, fill(17 * 4, 3)};
  return out;
}

struct PushFixture {
  explicit PushFixture(int replicas, int fanout, std::set<std::string> no_relay = {})
      : core(
            [this](const std::string& address) -> std::unique_ptr<Destination> {
              auto d = std::make_unique<PushedReplica>();
              made[address] = d.get();
              return d;
            },
            service_side.get(), fanout) {
    core.EnablePush(true, absl::Seconds(2));
    core.SetFileRoot(std::getenv("TEST_TMPDIR"));
    for (int i = 0; i < replicas; ++i) {
      v1::RegisterDestinationRequest reg;
      reg.set_replica_id(absl::StrCat("r", i));
      reg.set_grpc_address(absl::StrCat("r", i, ":1"));
      reg.set_can_relay(!no_relay.count(reg.replica_id()));
      v1::RegisterDestinationResponse registered;
      EXPECT_TRUE(core.RegisterDestination(reg, &registered).ok());
    }
  }
  void PublishImage(uint64_t version) {
    const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/push-v", version);
    ASSERT_TRUE(model::WriteSafetensors(path, Tensors()).ok());
    std::ifstream in(path, std::ios::binary);
    image.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    v1::PublishVersionResponse published;
    ASSERT_TRUE(core.PublishVersion(PublishFile(version, path, image), &published).ok());
  }
  std::map<std::string, v1::DestinationSyncStatus> SyncAll() {
    v1::SyncVersionRequest sync;  // (no replica_id: every destination)
    sync.set_commit(true);
    sync.set_timeout_ms(30000);
    v1::SyncVersionResponse synced;
    absl::Status s = core.SyncVersion(sync, &synced);
    EXPECT_TRUE(s.ok()) << s;
    std::map<std::string, v1::DestinationSyncStatus> out;
    for (const auto& d : synced.destinations()) out[d.replica_id()] = d;
    return out;
  }
  std::unique_ptr<transport::Transport> service_side = transport::LoopbackTransport::Create();
  std::map<std::string, PushedReplica*> made;
  WeightsCore core;
  std::string image;
};

void ExpectEveryTensor(const PushedReplica& r, const std::string& id) {
  for (const auto& [name, blob] : Tensors()) {
    auto it = r.tensors.find(name);
    ASSERT_NE(it, r.tensors.end()) << id << " lacks " << name;
    EXPECT_EQ(it->second, blob.bytes) << id << ": " << name;
  }
}

// In a push chain, a replica that may not relay comes last: r1 is fed, feeds nobody.
TEST(WeightsPush, AReplicaThatMayNotRelayEndsItsChain) {
  PushFixture f(3, 1, /*no_relay=*/{"r1"});
  f.PublishImage(4);
  auto status = f.SyncAll();
  ASSERT_EQ(status.size(), 3u);
  const std::map<std::string, std::string> parent = {{"r0", ""}, {"r2", "r0"}, {"r1", "r2"}};
  for (const auto& [id, s] : status) {
    EXPECT_EQ(s.phase(), v1::SYNC_PHASE_INSTALLED) << id << ": " << s.error();
    EXPECT_EQ(s.relayed_from(), parent.at(id)) << id;
    ExpectEveryTensor(*f.made[id + ":1"], id);
  }
}

// One SyncVersion for all: the version is pushed along a chain (fan-out 1), each
// replica relaying every chunk to the next; every replica has every tensor exactly,
// this service sent one copy, and the status says who relayed to whom.
TEST(WeightsPush, AChainOfReplicasGetsEveryTensorFromOnePush) {
  PushFixture f(3, 1);
  f.PublishImage(4);
  auto status = f.SyncAll();
  ASSERT_EQ(status.size(), 3u);
  uint64_t tensor_bytes = 0;
  for (const auto& [name, blob] : Tensors()) tensor_bytes += blob.bytes.size();
  const std::map<std::string, std::string> parent = {{"r0", ""}, {"r1", "r0"}, {"r2", "r1"}};
  for (const auto& [id, s] : status) {
    EXPECT_EQ(s.phase(), v1::SYNC_PHASE_INSTALLED) << id << ": " << s.error();
    EXPECT_TRUE(s.pushed()) << id;
    EXPECT_EQ(s.relayed_from(), parent.at(id)) << id;
    EXPECT_EQ(s.bytes_moved(), tensor_bytes) << id;  // the layout's bytes, not the image's
    ExpectEveryTensor(*f.made[id + ":1"], id);
    EXPECT_EQ(f.made[id + ":1"]->pushes, 1) << id;
  }
  // The same version again: already installed everywhere, nothing moves.
  status = f.SyncAll();
  for (const auto& [id, s] : status) {
    EXPECT_EQ(s.phase(), v1::SYNC_PHASE_INSTALLED) << id;
    EXPECT_EQ(f.made[id + ":1"]->pushes, 1) << id;
  }
  // The next version reuses the memory and the mappings, and lands as exactly.
  f.PublishImage(5);
  status = f.SyncAll();
  for (const auto& [id, s] : status) {
    EXPECT_EQ(s.phase(), v1::SYNC_PHASE_INSTALLED) << id << ": " << s.error();
    EXPECT_EQ(s.version(), 5u);
    ExpectEveryTensor(*f.made[id + ":1"], id);
  }
}

// A replica without a data plane is pulled to; a replica that is gone when the round
// comes breaks the chain after it: the replicas the push missed pull the version
// within the same call, and only the dead one is FAILED, with its reason.
TEST(WeightsPush, ReplicasThePushMissesPullTheVersionInstead) {
  PushFixture f(4, 1);
  f.made["r1:1"]->dies = true;
  f.made["r3:1"]->has_data_plane = false;
  f.PublishImage(7);
  const absl::Time start = absl::Now();
  auto status = f.SyncAll();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  ASSERT_EQ(status.size(), 4u);
  EXPECT_EQ(status["r1"].phase(), v1::SYNC_PHASE_FAILED);
  EXPECT_TRUE(absl::StrContains(status["r1"].error(), "replica gone")) << status["r1"].error();
  EXPECT_EQ(status["r3"].phase(), v1::SYNC_PHASE_INSTALLED) << status["r3"].error();
  EXPECT_FALSE(status["r3"].pushed());
  EXPECT_EQ(f.made["r3:1"]->pulled, f.image);
  // r0 relayed to the dead r1 (its forward failed) and r2 waited for r1: both pulled.
  for (const std::string id : {"r0", "r2"}) {
    EXPECT_EQ(status[id].phase(), v1::SYNC_PHASE_INSTALLED) << id << ": " << status[id].error();
    EXPECT_TRUE(status[id].pushed() || f.made[id + ":1"]->pulled == f.image) << id;
  }
}

// Only the newest two versions keep their bytes (their memory goes to the next pull): an
// older one asked for is FAILED_PRECONDITION saying so, the newer ones still sync.
TEST(WeightsPush, VersionsOlderThanTheKeptOnesAreRefusedByName) {
  PushFixture f(1, 1);
  for (uint64_t v : {4, 5, 6}) f.PublishImage(v);
  v1::SyncVersionRequest sync;
  sync.set_commit(true);
  sync.set_replica_id("r0");
  sync.set_version(4);
  v1::SyncVersionResponse synced;
  absl::Status s = f.core.SyncVersion(sync, &synced);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "keep_versions")) << s;
  for (uint64_t v : {5, 6}) {
    sync.set_version(v);
    s = f.core.SyncVersion(sync, &synced);
    EXPECT_TRUE(s.ok()) << v << ": " << s;
    EXPECT_EQ(synced.status().phase(), v1::SYNC_PHASE_INSTALLED) << v;
  }
  ExpectEveryTensor(*f.made["r0:1"], "r0");
}

}  // namespace push

}  // namespace
}  // namespace rlfleet::weights

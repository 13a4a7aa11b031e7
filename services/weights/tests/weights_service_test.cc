// WeightsService through its gRPC adapter on a loopback server, as a peer on the
// network calls it: FILE descriptors reach only regular files under --publish_dir,
// every number is range-checked in its own type, sizes are bounded before anything is
// allocated, fields the service does not support are refused by name, and a thread
// that cannot be created is RESOURCE_EXHAUSTED, not std::terminate.
#include "services/weights/weights_service.h"

#include <grpcpp/create_channel.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/common/checksum.h"
#include "libs/rpc/server_runner.h"
#include "libs/transport/loopback/loopback_transport.h"
#include "services/weights/spawn.h"
#include "services/weights/weights_core.h"

namespace rlfleet::weights {
namespace {

class Installs : public Destination {
 public:
  absl::StatusOr<v1::CommitWeightsResponse> Install(const v1::PrepareWeightsRequest& request, absl::Time) override {
    v1::CommitWeightsResponse r;
    *r.mutable_installed_version() = request.manifest().version();
    return r;
  }
};

// A weights service on a loopback port, its data plane in-process, FILE descriptors
// allowed under `root` (empty: none).
struct Served {
  explicit Served(const std::string& root, uint64_t max_version_bytes = uint64_t{16} << 30)
      : core([](const std::string&) { return std::make_unique<Installs>(); }, plane.get()),
        runner(rpc::ServerOptions{}),
        service(&core, rpc::CallAuth{}) {
    core.SetFileRoot(root);
    core.SetMaxVersionBytes(max_version_bytes);
    runner.AddService(&service);
    EXPECT_TRUE(runner.Start().ok());
    stub = v1::WeightsService::NewStub(grpc::CreateChannel(runner.address(), grpc::InsecureChannelCredentials()));
  }
  template <typename Request, typename Response>
  grpc::Status Call(grpc::Status (v1::WeightsService::Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response = nullptr) {
    Response ignored;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return (stub.get()->*rpc)(&context, request, response != nullptr ? response : &ignored);
  }
  grpc::Status Publish(const v1::PublishVersionRequest& r) {
    return Call(&v1::WeightsService::Stub::PublishVersion, r);
  }
  grpc::Status Register(const v1::RegisterDestinationRequest& r) {
    return Call(&v1::WeightsService::Stub::RegisterDestination, r);
  }
  grpc::Status Sync(const v1::SyncVersionRequest& r) { return Call(&v1::WeightsService::Stub::SyncVersion, r); }

  std::unique_ptr<transport::LoopbackTransport> plane = transport::LoopbackTransport::Create();
  WeightsCore core;
  rpc::ServerRunner runner;
  WeightsServiceImpl service;
  std::unique_ptr<v1::WeightsService::Stub> stub;
};

std::string Tmp() { return std::getenv("TEST_TMPDIR"); }

// Publishes the file at `path` (its `bytes` as the digest says) as `version`.
v1::PublishVersionRequest PublishFile(uint64_t version, const std::string& path, const std::string& bytes,
                                      uint64_t length = 0) {
  v1::PublishVersionRequest r;
  r.mutable_manifest()->mutable_version()->set_version(version);
  v1::TransferDescriptor* where = r.add_sources()->add_shards()->mutable_location();
  where->mutable_segment()->set_backend(v1::TRANSFER_BACKEND_FILE);
  where->mutable_segment()->set_worker_address(path);
  where->set_length_bytes(length != 0 ? length : bytes.size());
  where->mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
  where->mutable_digest()->set_value(common::Xxh64(bytes));
  return r;
}

void ExpectRefused(const grpc::Status& s, grpc::StatusCode code, const std::string& field) {
  EXPECT_EQ(s.error_code(), code) << field << ": " << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), field)) << s.error_message();
}

std::string MakeRoot(const std::string& name) {
  const std::string root = Tmp() + "/" + name;
  EXPECT_TRUE(mkdir(root.c_str(), 0755) == 0 || errno == EEXIST);
  return root;
}

TEST(WeightsService, FileDescriptorsReachOnlyRegularFilesUnderThePublishDir) {
  const std::string root = MakeRoot("publish");
  const std::string version(8192, 'v');
  std::ofstream(root + "/policy-v1.safetensors", std::ios::binary) << version;
  const std::string secret = "a host file that is not a policy version";
  std::ofstream(Tmp() + "/secret.txt", std::ios::binary) << secret;
  ASSERT_EQ(mkfifo((root + "/fifo").c_str(), 0600), 0);
  ASSERT_EQ(mkdir((root + "/dir").c_str(), 0755), 0);

  // Started without --publish_dir: no file is read at all.
  {
    Served none("");
    ExpectRefused(none.Publish(PublishFile(1, root + "/policy-v1.safetensors", version)),
                  grpc::StatusCode::INVALID_ARGUMENT, "--publish_dir");
  }
  Served served(root);
  // A host file with its right digest is no policy version; /dev/zero, a FIFO and a
  // directory neither block nor exhaust the service (each answered at once).
  const absl::Time start = absl::Now();
  for (const std::string& path : {Tmp() + "/secret.txt", root + "/../secret.txt", std::string("/dev/zero"),
                                  root + "/fifo", root + "/dir", std::string("/proc/self/environ")}) {
    grpc::Status s = served.Publish(PublishFile(1, path, secret));
    ExpectRefused(s, grpc::StatusCode::INVALID_ARGUMENT, "worker_address");
    EXPECT_FALSE(absl::StrContains(s.error_message(), "host file")) << "the file's bytes leak: " << s.error_message();
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // A 2 GiB length for an 8 KiB file: refused before it is allocated, the size not told.
  grpc::Status s = served.Publish(PublishFile(1, root + "/policy-v1.safetensors", version, uint64_t{2} << 30));
  ExpectRefused(s, grpc::StatusCode::INVALID_ARGUMENT, "length_bytes");
  EXPECT_FALSE(absl::StrContains(s.error_message(), "8192")) << s.error_message();
  // The digest answer is no oracle for files outside the root: the same refusal
  // whatever digest is claimed.
  v1::PublishVersionRequest guess = PublishFile(1, Tmp() + "/secret.txt", secret);
  guess.mutable_sources(0)->mutable_shards(0)->mutable_location()->mutable_digest()->set_value(1);
  EXPECT_EQ(served.Publish(guess).error_message(),
            served.Publish(PublishFile(1, Tmp() + "/secret.txt", secret)).error_message());
  // The trainer's file under the root, by path or relative to it, is published.
  EXPECT_TRUE(served.Publish(PublishFile(1, root + "/policy-v1.safetensors", version)).ok());
  EXPECT_TRUE(served.Publish(PublishFile(2, "policy-v1.safetensors", version)).ok());
}

// One shard per (rank, tensor) of a 2-rank layout, each a memory descriptor.
v1::PublishVersionRequest Sharded(uint64_t version) {
  v1::PublishVersionRequest r;
  r.mutable_manifest()->mutable_version()->set_version(version);
  v1::ShardLayout* layout = r.mutable_manifest()->mutable_layout();
  layout->set_world_size(2);
  v1::TensorLayout* t = layout->add_tensors();
  t->mutable_spec()->set_name("w");
  t->mutable_spec()->set_dtype(v1::DTYPE_FLOAT32);
  t->mutable_spec()->add_shape(4);
  t->mutable_spec()->add_shape(4);
  t->set_kind(v1::LAYOUT_KIND_FSDP_FLAT);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    v1::SourceRank* s = r.add_sources();
    s->set_rank(rank);
    v1::SourceShard* shard = s->add_shards();
    shard->set_tensor_name("w");
    shard->mutable_location()->mutable_segment()->set_backend(v1::TRANSFER_BACKEND_LOOPBACK);
    shard->mutable_location()->mutable_segment()->set_worker_address("nobody");
    shard->mutable_location()->mutable_segment()->set_length_bytes(32);
    shard->mutable_location()->set_length_bytes(32);
    shard->mutable_location()->mutable_digest()->set_algorithm(v1::DIGEST_ALGORITHM_XXHASH64);
  }
  return r;
}

TEST(WeightsService, EveryNumberIsCheckedInItsOwnTypeAndEverySizeBeforeItIsAllocated) {
  const std::string root = MakeRoot("numbers");
  const std::string image(4096, 'i');
  std::ofstream(root + "/v1", std::ios::binary) << image;
  Served served(root, /*max_version_bytes=*/64 << 20);
  // A source rank of 2^31 or 2^32-1 is no negative int: refused by name.
  for (uint32_t rank : {0x80000000u, 0xffffffffu, 2u}) {
    v1::PublishVersionRequest r = Sharded(3);
    r.mutable_sources(1)->set_rank(rank);
    ExpectRefused(served.Publish(r), grpc::StatusCode::INVALID_ARGUMENT, "sources[1].rank");
  }
  v1::PublishVersionRequest r = Sharded(3);
  r.mutable_manifest()->mutable_layout()->set_world_size(0xffffffffu);
  ExpectRefused(served.Publish(r), grpc::StatusCode::INVALID_ARGUMENT, "manifest.layout.world_size");
  // A shape of 2^30 x 2^10 floats (4 TiB), a 2 GiB one over --max_version_mib, and a
  // shard longer than its tensor: refused before a byte is allocated.
  r = Sharded(3);
  r.mutable_manifest()->mutable_layout()->mutable_tensors(0)->mutable_spec()->set_shape(0, int64_t{1} << 30);
  r.mutable_manifest()->mutable_layout()->mutable_tensors(0)->mutable_spec()->set_shape(1, int64_t{1} << 10);
  ExpectRefused(served.Publish(r), grpc::StatusCode::INVALID_ARGUMENT, "manifest.layout");
  r = Sharded(3);
  r.mutable_manifest()->mutable_layout()->mutable_tensors(0)->mutable_spec()->set_shape(0, int64_t{1} << 27);
  ExpectRefused(served.Publish(r), grpc::StatusCode::INVALID_ARGUMENT, "--max_version_mib");
  r = Sharded(3);
  r.mutable_sources(0)->mutable_shards(0)->mutable_location()->set_length_bytes(uint64_t{2} << 30);
  ExpectRefused(served.Publish(r), grpc::StatusCode::INVALID_ARGUMENT, "sources[0].shards[0].location.length_bytes");
  r = Sharded(3);
  r.mutable_sources(0)->mutable_shards(0)->mutable_location()->set_length_bytes(1 << 20);
  ExpectRefused(served.Publish(r), grpc::StatusCode::INVALID_ARGUMENT, "sources[0].shards[0].location.length_bytes");
  r = Sharded(3);
  r.set_trainer_pause_us(-1);
  ExpectRefused(served.Publish(r), grpc::StatusCode::INVALID_ARGUMENT, "trainer_pause_us");
  r = Sharded(3);
  r.mutable_manifest()->set_total_bytes(12345);
  ExpectRefused(served.Publish(r), grpc::StatusCode::INVALID_ARGUMENT, "manifest.total_bytes");
  r = Sharded(3);
  r.mutable_manifest()->add_shard_digests()->set_tensor_name("w");
  ExpectRefused(served.Publish(r), grpc::StatusCode::INVALID_ARGUMENT, "manifest.shard_digests");
  // Fields this service does not support are refused by name, not ignored.
  r = Sharded(3);
  r.mutable_sources(0)->mutable_endpoint()->set_host("h");
  ExpectRefused(served.Publish(r), grpc::StatusCode::UNIMPLEMENTED, "sources[0].endpoint");
  r = Sharded(3);
  r.mutable_manifest()->set_wire_dtype(v1::DTYPE_BFLOAT16);
  ExpectRefused(served.Publish(r), grpc::StatusCode::UNIMPLEMENTED, "manifest.wire_dtype");

  // Destinations: a layout of 10^8 ranks (with or without tensors) is refused, not
  // allocated; ranks and wire_dtype are not supported.
  v1::RegisterDestinationRequest reg;
  reg.set_replica_id("r");
  reg.set_grpc_address("r:1");
  v1::RegisterDestinationRequest bad = reg;
  bad.mutable_layout()->set_world_size(100000000);
  ExpectRefused(served.Register(bad), grpc::StatusCode::INVALID_ARGUMENT, "layout.world_size");
  *bad.mutable_layout() = Sharded(1).manifest().layout();
  bad.mutable_layout()->set_world_size(100000000);
  ExpectRefused(served.Register(bad), grpc::StatusCode::INVALID_ARGUMENT, "layout.world_size");
  bad = reg;
  bad.add_ranks()->set_rank(0);
  ExpectRefused(served.Register(bad), grpc::StatusCode::UNIMPLEMENTED, "ranks");
  bad = reg;
  bad.set_wire_dtype(v1::DTYPE_BFLOAT16);
  ExpectRefused(served.Register(bad), grpc::StatusCode::UNIMPLEMENTED, "wire_dtype");

  // A version whose layout is one tall column-split tensor (1 GiB allowed here), and a
  // destination of 64 ranks splitting it by columns: the plan's cost is refused before
  // anything is planned.
  Served big(root, uint64_t{2} << 30);
  v1::PublishVersionRequest tall = PublishFile(1, root + "/v1", image);
  v1::TensorLayout* t = tall.mutable_manifest()->mutable_layout()->add_tensors();
  tall.mutable_manifest()->mutable_layout()->set_world_size(1);
  t->mutable_spec()->set_name("tall");
  t->mutable_spec()->set_dtype(v1::DTYPE_FLOAT32);
  t->mutable_spec()->add_shape(int64_t{1} << 22);
  t->mutable_spec()->add_shape(64);
  t->set_kind(v1::LAYOUT_KIND_REPLICATED);
  ASSERT_TRUE(big.Publish(tall).ok());
  v1::RegisterDestinationRequest columns = reg;
  *columns.mutable_layout() = tall.manifest().layout();
  columns.mutable_layout()->set_world_size(64);
  columns.mutable_layout()->mutable_tensors(0)->set_kind(v1::LAYOUT_KIND_TP_COLUMN);
  columns.mutable_layout()->mutable_tensors(0)->set_axis(1);
  ASSERT_TRUE(big.Register(columns).ok());
  v1::GetPlanRequest plan;
  plan.set_replica_id("r");
  const absl::Time start = absl::Now();
  ExpectRefused(big.Call(&v1::WeightsService::Stub::GetPlan, plan), grpc::StatusCode::INVALID_ARGUMENT, "costs");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // Syncs: a negative timeout and commit = false are refused by name.
  v1::SyncVersionRequest sync;
  sync.set_replica_id("r");
  sync.set_commit(true);
  sync.set_timeout_ms(-1);
  ExpectRefused(big.Sync(sync), grpc::StatusCode::INVALID_ARGUMENT, "timeout_ms");
  sync.set_timeout_ms(0);
  sync.set_commit(false);
  ExpectRefused(big.Sync(sync), grpc::StatusCode::UNIMPLEMENTED, "commit");
  sync.set_commit(true);
  sync.clear_replica_id();
  sync.add_replica_ids("");
  ExpectRefused(big.Sync(sync), grpc::StatusCode::INVALID_ARGUMENT, "replica_ids[0]");
}

// A destination layout's shape that no plan can hold is refused when registered, not
// accepted and found out at the first sync.
TEST(WeightsService, ADestinationShapeThatOverflowsIsRefusedAtRegistration) {
  Served served("");
  v1::RegisterDestinationRequest reg;
  reg.set_replica_id("r");
  reg.set_grpc_address("127.0.0.1:1");
  v1::TensorLayout* t = reg.mutable_layout()->add_tensors();
  reg.mutable_layout()->set_world_size(1);
  t->mutable_spec()->set_name("w");
  t->mutable_spec()->set_dtype(v1::DTYPE_FLOAT32);
  t->mutable_spec()->add_shape(int64_t{1} << 62);
  t->mutable_spec()->add_shape(int64_t{1} << 62);
  t->set_kind(v1::LAYOUT_KIND_REPLICATED);
  grpc::Status s = served.Register(reg);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "layout.tensors[0].spec.shape")) << s.error_message();
  t->mutable_spec()->set_shape(0, -3);
  EXPECT_EQ(served.Register(reg).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  t->mutable_spec()->set_shape(0, 4);
  t->mutable_spec()->set_shape(1, 4);
  EXPECT_TRUE(served.Register(reg).ok());
}

// An RPC the service does not offer says so, with a message naming what to use.
TEST(WeightsService, AnRpcNotOfferedIsRefusedWithAMessage) {
  Served served("");
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto reader = served.stub->WatchVersions(&context, v1::WatchVersionsRequest());
  v1::VersionEvent event;
  EXPECT_FALSE(reader->Read(&event));
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "WatchVersions")) << s.error_message();
}

TEST(WeightsService, NoThreadForASyncIsResourceExhaustedNotTerminate) {
  const std::string root = MakeRoot("threads");
  const std::string image(4096, 't');
  std::ofstream(root + "/v1", std::ios::binary) << image;
  Served served(root);
  ASSERT_TRUE(served.Publish(PublishFile(1, root + "/v1", image)).ok());
  v1::RegisterDestinationRequest reg;
  reg.set_replica_id("r");
  reg.set_grpc_address("r:1");
  ASSERT_TRUE(served.Register(reg).ok());
  v1::SyncVersionRequest sync;  // (every destination: one thread per replica)
  sync.set_commit(true);
  spawn_fails_for_test = true;
  grpc::Status s = served.Sync(sync);
  spawn_fails_for_test = false;
  ExpectRefused(s, grpc::StatusCode::RESOURCE_EXHAUSTED, "no thread");
  // The service still serves.
  v1::SyncVersionResponse synced;
  ASSERT_TRUE(served.Call(&v1::WeightsService::Stub::SyncVersion, sync, &synced).ok());
  ASSERT_EQ(synced.destinations_size(), 1);
  EXPECT_EQ(synced.destinations(0).phase(), v1::SYNC_PHASE_INSTALLED);
}

}  // namespace
}  // namespace rlfleet::weights

// RunPeersFactory: a run's rollout replicas are the flag's and the registered ones;
// a missing peer is FAILED_PRECONDITION naming its flag; the reward, buffer and
// trainer given by flag need nothing registered.
#include "services/controller/run_peers_factory.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/registry/registry.h"
#include "services/controller/run_peers_grpc.h"

namespace rlfleet::controller {
namespace {

struct Fixture {
  Fixture() : registry(*registry::OpenRegistry("memory://", common::Clock::Real())) {}
  void Register(v1::ReplicaRole role, const std::string& id, const std::string& address) {
    v1::RegisterRequest r;
    r.mutable_replica()->set_replica_id(id);
    r.mutable_replica()->set_role(role);
    r.mutable_replica()->set_grpc_address(address);
    v1::RegisterResponse out;
    ASSERT_TRUE(core.Register(r, &out).ok());
  }
  std::unique_ptr<registry::Registry> registry;
  ControllerCore core{registry.get(), common::Clock::Real()};
};

TEST(RunPeersFactory, AMissingPeerIsRefusedNamingItsFlag) {
  Fixture f;
  RunPeersFactory none(&f.core, {}, {});
  absl::StatusOr<RunPeers> peers = none.Make();
  EXPECT_EQ(peers.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(peers.status().message(), "no --rollout")) << peers.status();
  f.Register(v1::REPLICA_ROLE_ROLLOUT, "rollout-0", "127.0.0.1:1");
  peers = none.Make();
  EXPECT_EQ(peers.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(peers.status().message(), "no --reward")) << peers.status();
}

TEST(RunPeersFactory, RolloutsAreTheFlagsAndTheRegisteredOnesEachOnce) {
  Fixture f;
  f.Register(v1::REPLICA_ROLE_ROLLOUT, "rollout-0", "127.0.0.1:3");
  f.Register(v1::REPLICA_ROLE_ROLLOUT, "rollout-1", "127.0.0.1:2");
  f.Register(v1::REPLICA_ROLE_BUFFER, "buffer-0", "127.0.0.1:9");
  PeerAddresses flags;
  flags.rollout = "127.0.0.1:1,127.0.0.1:2";
  flags.reward = "127.0.0.1:7";
  flags.trainer = "127.0.0.1:8";
  RunPeersFactory factory(&f.core, {}, flags);
  absl::StatusOr<RunPeers> peers = factory.Make();
  ASSERT_TRUE(peers.ok()) << peers.status();
  EXPECT_EQ(peers->rollouts.size(), 3u);
  EXPECT_NE(peers->reward, nullptr);
  EXPECT_NE(peers->buffer, nullptr);  // (the registered one)
  EXPECT_NE(peers->trainer, nullptr);
  // Without a weights service, a replica discovered mid-run is a plain one.
  absl::StatusOr<std::unique_ptr<RolloutReplica>> late = factory.Replica("127.0.0.1:4");
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_NE(*late, nullptr);
}

// A peer that is not there is an error naming the call and the peer's address; a call
// that must not run twice (GenerateBatch) is tried once.
TEST(RunPeersGrpc, ErrorsNameTheMethodAndThePeer) {
  rpc::ClientOptions options;
  options.retry.initial_backoff = absl::Milliseconds(1);
  auto replica = NewGrpcRolloutReplica(options, "127.0.0.1:1", absl::Seconds(5));
  ASSERT_TRUE(replica.ok()) << replica.status();
  v1::GenerateBatchResponse out;
  absl::Status s = (*replica)->GenerateBatch(v1::GenerateBatchRequest(), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "GenerateBatch to 127.0.0.1:1:")) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "attempts")) << s;  // (one attempt: not retried)
  auto trainer = NewGrpcTrainerPeer(options, "127.0.0.1:1", absl::Seconds(5));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<uint64_t> version = (*trainer)->PolicyVersion();
  EXPECT_TRUE(absl::StrContains(version.status().message(), "GetState to 127.0.0.1:1: after 4 attempts"))
      << version.status();
}

}  // namespace
}  // namespace rlfleet::controller

// Conformance suite for Registry backends, driven by a FakeClock. The Redis backend
// joins the parameter list when it lands.
#include "libs/registry/registry.h"

#include <functional>
#include <memory>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"

namespace rlfleet::registry {
namespace {

v1::ReplicaInfo Replica(const std::string& id, v1::ReplicaRole role) {
  v1::ReplicaInfo info;
  info.set_replica_id(id);
  info.set_role(role);
  info.set_grpc_address("127.0.0.1:7000");
  return info;
}

class RegistryTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto registry = OpenRegistry(GetParam(), &clock_);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = std::move(*registry);
  }
  common::FakeClock clock_;
  std::unique_ptr<Registry> registry_;
};

TEST_P(RegistryTest, RegisterListAndFilterByRole) {
  ASSERT_TRUE(registry_->Register(Replica("reward-1", v1::REPLICA_ROLE_REWARD), {}).ok());
  auto lease = registry_->Register(Replica("rollout-1", v1::REPLICA_ROLE_ROLLOUT),
                                   absl::Seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->ttl, absl::Seconds(5));
  EXPECT_FALSE(lease->lease_id.empty());

  auto all = registry_->List(v1::REPLICA_ROLE_UNSPECIFIED, false);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].replica_id(), "reward-1");  // ordered by id
  auto rollouts = registry_->List(v1::REPLICA_ROLE_ROLLOUT, false);
  ASSERT_EQ(rollouts->size(), 1u);
  EXPECT_EQ((*rollouts)[0].replica_id(), "rollout-1");
}

TEST_P(RegistryTest, RolloutIsAdmittedOnlyAfterReportingAVerifiedVersion) {
  auto lease = registry_->Register(Replica("rollout-1", v1::REPLICA_ROLE_ROLLOUT), {});
  ASSERT_TRUE(lease.ok());
  EXPECT_FALSE(lease->replica.admitted());
  EXPECT_TRUE(registry_->List(v1::REPLICA_ROLE_ROLLOUT, true)->empty());

  v1::PolicyVersion v;
  v.set_version(3);
  v1::LoadStats load;
  load.set_active_sequences(7);
  auto beat = registry_->Heartbeat("rollout-1", lease->lease_id, load, v);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_TRUE(beat->admitted);
  auto admitted = registry_->List(v1::REPLICA_ROLE_ROLLOUT, true);
  ASSERT_EQ(admitted->size(), 1u);
  EXPECT_EQ((*admitted)[0].policy_version().version(), 3u);
  EXPECT_EQ((*admitted)[0].load().active_sequences(), 7u);
}

TEST_P(RegistryTest, LeaseExpiresWithoutHeartbeatAndHeartbeatRenewsIt) {
  auto lease = registry_->Register(Replica("trainer-0", v1::REPLICA_ROLE_TRAINER),
                                   absl::Seconds(3));
  ASSERT_TRUE(lease.ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(registry_->Heartbeat("trainer-0", lease->lease_id, {}, {}).ok());
  clock_.Advance(absl::Seconds(2));  // 4 s after register, 2 s after the heartbeat
  EXPECT_EQ(registry_->List(v1::REPLICA_ROLE_TRAINER, false)->size(), 1u);
  clock_.Advance(absl::Seconds(1));  // 3 s after the heartbeat: expired
  EXPECT_TRUE(registry_->List(v1::REPLICA_ROLE_TRAINER, false)->empty());
  auto late = registry_->Heartbeat("trainer-0", lease->lease_id, {}, {});
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(late.status().message(), "register again"));
}

TEST_P(RegistryTest, ReRegisterReplacesTheOldLease) {
  auto first = registry_->Register(Replica("buffer-0", v1::REPLICA_ROLE_BUFFER), {});
  auto second = registry_->Register(Replica("buffer-0", v1::REPLICA_ROLE_BUFFER), {});
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first->lease_id, second->lease_id);
  EXPECT_EQ(registry_->Heartbeat("buffer-0", first->lease_id, {}, {}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry_->Heartbeat("buffer-0", second->lease_id, {}, {}).ok());
  EXPECT_EQ(registry_->List(v1::REPLICA_ROLE_BUFFER, false)->size(), 1u);
}

TEST_P(RegistryTest, DeregisterIsIdempotent) {
  auto lease = registry_->Register(Replica("reward-1", v1::REPLICA_ROLE_REWARD), {});
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(registry_->Deregister("reward-1", "lease-wrong").value(), false);
  EXPECT_EQ(registry_->Deregister("reward-1", lease->lease_id).value(), true);
  EXPECT_EQ(registry_->Deregister("reward-1", lease->lease_id).value(), false);
  EXPECT_TRUE(registry_->List(v1::REPLICA_ROLE_UNSPECIFIED, false)->empty());
}

TEST_P(RegistryTest, BadRegistrationsNameTheField) {
  auto no_id = registry_->Register(Replica("", v1::REPLICA_ROLE_REWARD), {});
  EXPECT_EQ(no_id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(no_id.status().message(), "replica.replica_id"));

  auto no_role = registry_->Register(Replica("x", v1::REPLICA_ROLE_UNSPECIFIED), {});
  EXPECT_TRUE(absl::StrContains(no_role.status().message(), "replica.role"));

  v1::ReplicaInfo bad_address = Replica("x", v1::REPLICA_ROLE_REWARD);
  bad_address.set_grpc_address("nohostport");
  EXPECT_TRUE(absl::StrContains(registry_->Register(bad_address, {}).status().message(),
                                "replica.grpc_address"));

  auto short_ttl = registry_->Register(Replica("x", v1::REPLICA_ROLE_REWARD),
                                       absl::Milliseconds(10));
  EXPECT_EQ(short_ttl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(short_ttl.status().message(), "ttl_ms"));
}

INSTANTIATE_TEST_SUITE_P(Backends, RegistryTest, ::testing::Values("memory://"));

TEST(OpenRegistry, UnknownSchemeIsInvalidArgument) {
  common::FakeClock clock;
  auto r = OpenRegistry("etcd://x", &clock);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "etcd://x"));
}

}  // namespace
}  // namespace rlfleet::registry

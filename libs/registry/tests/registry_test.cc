// Conformance suite for Registry backends, driven by a FakeClock. The Redis backend
// joins the parameter list when it lands.
#include "libs/registry/registry.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/common/ids.h"
#include "libs/registry/watch.h"
#include "tests/util/redis_for_test.h"
#include "tests/util/subprocess.h"

namespace rlfleet::registry {
namespace {

v1::ReplicaInfo Replica(const std::string& id, v1::ReplicaRole role) {
  v1::ReplicaInfo info;
  info.set_replica_id(id);
  info.set_role(role);
  info.set_grpc_address("127.0.0.1:7000");
  return info;
}

// "redis" runs against a redis-server (tools/test.sh's, or one started for this test:
// redis_for_test.h), each test under its own key prefix.
absl::StatusOr<std::string> Connection(const std::string& backend) {
  if (backend != "redis") return backend;
  absl::StatusOr<int> port = rlfleet::testing::RedisPortForTest();
  if (!port.ok()) return port.status();
  return absl::StrCat("redis://127.0.0.1:", *port, "/", common::NewId("test"), ":");
}

class RegistryTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> connection_or = Connection(GetParam());
    ASSERT_TRUE(connection_or.ok()) << connection_or.status();
    const std::string connection = *connection_or;
    auto registry = OpenRegistry(connection, &clock_);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = std::move(*registry);
  }
  common::FakeClock clock_;
  std::unique_ptr<Registry> registry_;
};

TEST_P(RegistryTest, RegisterListAndFilterByRole) {
  ASSERT_TRUE(registry_->Register(Replica("reward-1", v1::REPLICA_ROLE_REWARD), {}).ok());
  auto lease = registry_->Register(Replica("rollout-1", v1::REPLICA_ROLE_ROLLOUT), absl::Seconds(5));
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
  auto lease = registry_->Register(Replica("trainer-0", v1::REPLICA_ROLE_TRAINER), absl::Seconds(3));
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

TEST_P(RegistryTest, WatchSeesEveryKindOfChange) {
  RegistryWatch watch(registry_.get(), &clock_);
  auto lease = registry_->Register(Replica("rollout-1", v1::REPLICA_ROLE_ROLLOUT), absl::Seconds(3));
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(registry_->Register(Replica("reward-1", v1::REPLICA_ROLE_REWARD), absl::Seconds(60)).ok());
  ASSERT_TRUE(watch.Poll().ok());
  // A late watcher of rollouts gets the snapshot first, and only rollouts.
  auto rollouts = watch.Subscribe(v1::REPLICA_ROLE_ROLLOUT, /*snapshot=*/true);
  auto all = watch.Subscribe(v1::REPLICA_ROLE_UNSPECIFIED, /*snapshot=*/false);
  auto next = [](Subscription& s) {
    auto e = s.Next(absl::ZeroDuration());
    return e ? std::make_pair(e->type(), e->replica().replica_id())
             : std::make_pair(v1::REPLICA_EVENT_TYPE_UNSPECIFIED, std::string());
  };
  EXPECT_EQ(next(*rollouts), std::make_pair(v1::REPLICA_EVENT_TYPE_ADDED, std::string("rollout-1")));
  EXPECT_EQ(next(*rollouts).first, v1::REPLICA_EVENT_TYPE_UNSPECIFIED);  // nothing more

  // Admitted once it reports a version; then a load change is an update.
  v1::PolicyVersion v;
  v.set_version(1);
  ASSERT_TRUE(registry_->Heartbeat("rollout-1", lease->lease_id, {}, v).ok());
  ASSERT_TRUE(watch.Poll().ok());
  EXPECT_EQ(next(*rollouts), std::make_pair(v1::REPLICA_EVENT_TYPE_ADMITTED, std::string("rollout-1")));
  v1::LoadStats load;
  load.set_active_sequences(4);
  ASSERT_TRUE(registry_->Heartbeat("rollout-1", lease->lease_id, load, v).ok());
  ASSERT_TRUE(watch.Poll().ok());
  EXPECT_EQ(next(*rollouts), std::make_pair(v1::REPLICA_EVENT_TYPE_UPDATED, std::string("rollout-1")));

  // Deregistered on request: REMOVED; a lease that runs out: EXPIRED.
  auto trainer = registry_->Register(Replica("trainer-0", v1::REPLICA_ROLE_TRAINER), absl::Seconds(60));
  ASSERT_TRUE(trainer.ok());
  ASSERT_TRUE(watch.Poll().ok());
  ASSERT_TRUE(registry_->Deregister("trainer-0", trainer->lease_id).ok());
  watch.NoteDeregistered("trainer-0");
  clock_.Advance(absl::Seconds(4));  // rollout-1's 3 s lease runs out
  ASSERT_TRUE(watch.Poll().ok());
  EXPECT_EQ(next(*rollouts), std::make_pair(v1::REPLICA_EVENT_TYPE_EXPIRED, std::string("rollout-1")));
  std::vector<std::pair<v1::ReplicaEventType, std::string>> seen;
  for (auto e = next(*all); e.first != v1::REPLICA_EVENT_TYPE_UNSPECIFIED; e = next(*all)) seen.push_back(e);
  const std::vector<std::pair<v1::ReplicaEventType, std::string>> want = {
      {v1::REPLICA_EVENT_TYPE_ADMITTED, "rollout-1"},
      {v1::REPLICA_EVENT_TYPE_UPDATED, "rollout-1"},
      {v1::REPLICA_EVENT_TYPE_ADDED, "trainer-0"},
      {v1::REPLICA_EVENT_TYPE_ADMITTED, "trainer-0"},  // roles without weights: at once
      {v1::REPLICA_EVENT_TYPE_EXPIRED, "rollout-1"},
      {v1::REPLICA_EVENT_TYPE_REMOVED, "trainer-0"}};
  EXPECT_EQ(seen, want);
}

TEST_P(RegistryTest, ReRegisterReplacesTheOldLease) {
  auto first = registry_->Register(Replica("buffer-0", v1::REPLICA_ROLE_BUFFER), {});
  auto second = registry_->Register(Replica("buffer-0", v1::REPLICA_ROLE_BUFFER), {});
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first->lease_id, second->lease_id);
  EXPECT_EQ(registry_->Heartbeat("buffer-0", first->lease_id, {}, {}).status().code(), absl::StatusCode::kNotFound);
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
  EXPECT_TRUE(absl::StrContains(registry_->Register(bad_address, {}).status().message(), "replica.grpc_address"));

  auto short_ttl = registry_->Register(Replica("x", v1::REPLICA_ROLE_REWARD), absl::Milliseconds(10));
  EXPECT_EQ(short_ttl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(short_ttl.status().message(), "ttl_ms"));
}

TEST_P(RegistryTest, ALiveIdCannotBeTakenFromAnotherAddress) {
  auto holder = registry_->Register(Replica("rollout-7", v1::REPLICA_ROLE_ROLLOUT), absl::Seconds(3));
  ASSERT_TRUE(holder.ok()) << holder.status();
  v1::ReplicaInfo thief = Replica("rollout-7", v1::REPLICA_ROLE_ROLLOUT);
  thief.set_grpc_address("10.9.9.9:7000");
  auto taken = registry_->Register(thief, {});
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists) << taken.status();
  EXPECT_TRUE(absl::StrContains(taken.status().message(), "rollout-7")) << taken.status();
  EXPECT_TRUE(absl::StrContains(taken.status().message(), "127.0.0.1:7000")) << taken.status();
  // The holder keeps its lease and its address.
  EXPECT_TRUE(registry_->Heartbeat("rollout-7", holder->lease_id, {}, {}).ok());
  auto listed = registry_->List(v1::REPLICA_ROLE_ROLLOUT, false);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].grpc_address(), "127.0.0.1:7000");

  // The same address may register again (a restarted replica, a retried call).
  auto again = registry_->Register(Replica("rollout-7", v1::REPLICA_ROLE_ROLLOUT), absl::Seconds(3));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->lease_id, holder->lease_id);

  // Once the lease has expired, another address may take the id.
  clock_.Advance(absl::Seconds(4));
  auto later = registry_->Register(thief, {});
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(registry_->List(v1::REPLICA_ROLE_ROLLOUT, false)->at(0).grpc_address(), "10.9.9.9:7000");
}

TEST_P(RegistryTest, LoadOutOfRangeIsRefusedNamingTheField) {
  auto lease = registry_->Register(Replica("rollout-1", v1::REPLICA_ROLE_ROLLOUT), {});
  ASSERT_TRUE(lease.ok());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::function<void(v1::LoadStats*)>, std::string>> cases = {
      {[&](v1::LoadStats* l) { l->set_utilization(nan); }, "load.utilization"},
      {[&](v1::LoadStats* l) { l->set_utilization(1.5); }, "load.utilization"},
      {[&](v1::LoadStats* l) { l->set_utilization(-0.1); }, "load.utilization"},
      {[&](v1::LoadStats* l) { l->set_tokens_per_s(inf); }, "load.tokens_per_s"},
      {[&](v1::LoadStats* l) { l->set_tokens_per_s(-1); }, "load.tokens_per_s"},
      {[&](v1::LoadStats* l) { l->set_queued_requests(4000000000u); }, "load.queued_requests"},
      {[&](v1::LoadStats* l) { l->set_inflight_requests(kMaxLoadCount + 1); }, "load.inflight_requests"},
      {[&](v1::LoadStats* l) { l->set_active_sequences(kMaxLoadCount + 1); }, "load.active_sequences"},
      {[&](v1::LoadStats* l) { l->set_memory_used_bytes(~uint64_t{0}); }, "load.memory_used_bytes"},
  };
  for (const auto& [make, field] : cases) {
    v1::LoadStats load;
    make(&load);
    auto beat = registry_->Heartbeat("rollout-1", lease->lease_id, load, {});
    EXPECT_EQ(beat.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_TRUE(absl::StrContains(beat.status().message(), field)) << beat.status();
    v1::ReplicaInfo replica = Replica("rollout-2", v1::REPLICA_ROLE_ROLLOUT);
    *replica.mutable_load() = load;
    auto reg = registry_->Register(replica, {});
    EXPECT_EQ(reg.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_TRUE(absl::StrContains(reg.status().message(), "replica." + field)) << reg.status();
  }
  // Nothing refused was recorded; a load in range is.
  v1::LoadStats fine;
  fine.set_utilization(1.0);
  fine.set_queued_requests(kMaxLoadCount);
  ASSERT_TRUE(registry_->Heartbeat("rollout-1", lease->lease_id, fine, {}).ok());
  auto listed = registry_->List(v1::REPLICA_ROLE_ROLLOUT, false);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].load().utilization(), 1.0);

  v1::PolicyVersion long_digest;
  long_digest.set_digest(std::string(300, 'a'));
  auto beat = registry_->Heartbeat("rollout-1", lease->lease_id, {}, long_digest);
  EXPECT_TRUE(absl::StrContains(beat.status().message(), "policy_version.digest")) << beat.status();
}

TEST_P(RegistryTest, LabelsAndEndpointsAreCapped) {
  auto refused = [&](const std::function<void(v1::ReplicaInfo*)>& make) {
    v1::ReplicaInfo replica = Replica("reward-1", v1::REPLICA_ROLE_REWARD);
    make(&replica);
    return registry_->Register(replica, {}).status();
  };
  absl::Status many = refused([](v1::ReplicaInfo* r) {
    for (int i = 0; i <= kMaxLabels; ++i) (*r->mutable_labels())[absl::StrCat("k", i)] = "v";
  });
  EXPECT_EQ(many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(many.message(), "replica.labels has 33 entries")) << many;
  absl::Status long_key =
      refused([](v1::ReplicaInfo* r) { (*r->mutable_labels())[std::string(kMaxLabelKeyBytes + 1, 'k')] = "v"; });
  EXPECT_TRUE(absl::StrContains(long_key.message(), "replica.labels key")) << long_key;
  absl::Status empty_key = refused([](v1::ReplicaInfo* r) { (*r->mutable_labels())[""] = "v"; });
  EXPECT_TRUE(absl::StrContains(empty_key.message(), "replica.labels key")) << empty_key;
  absl::Status long_value =
      refused([](v1::ReplicaInfo* r) { (*r->mutable_labels())["pool"] = std::string(kMaxLabelValueBytes + 1, 'v'); });
  EXPECT_TRUE(absl::StrContains(long_value.message(), "replica.labels[pool]")) << long_value;
  absl::Status total = refused([](v1::ReplicaInfo* r) {
    for (int i = 0; i < 9; ++i) (*r->mutable_labels())[absl::StrCat("k", i)] = std::string(kMaxLabelValueBytes, 'v');
  });
  EXPECT_TRUE(absl::StrContains(total.message(), "bytes in all")) << total;
  absl::Status endpoints = refused([](v1::ReplicaInfo* r) {
    for (int i = 0; i <= kMaxDataPlaneEndpoints; ++i) r->add_data_plane_endpoints()->set_host("h");
  });
  EXPECT_TRUE(absl::StrContains(endpoints.message(), "replica.data_plane_endpoints")) << endpoints;
  absl::Status port = refused([](v1::ReplicaInfo* r) { r->add_data_plane_endpoints()->set_port(70000); });
  EXPECT_TRUE(absl::StrContains(port.message(), "replica.data_plane_endpoints[0].port")) << port;
  EXPECT_TRUE(registry_->List(v1::REPLICA_ROLE_UNSPECIFIED, false)->empty());
}

TEST_P(RegistryTest, LiveRegistrationsPerRoleAreCapped) {
  absl::StatusOr<std::string> connection = Connection(GetParam());
  ASSERT_TRUE(connection.ok()) << connection.status();
  RegistryLimits limits;
  limits.max_live_per_role = 3;
  auto capped = OpenRegistry(*connection, &clock_, limits);
  ASSERT_TRUE(capped.ok()) << capped.status();
  Registry& registry = **capped;
  std::vector<Lease> leases;
  for (int i = 0; i < 3; ++i) {
    auto lease = registry.Register(Replica(absl::StrCat("rollout-", i), v1::REPLICA_ROLE_ROLLOUT), absl::Seconds(3));
    ASSERT_TRUE(lease.ok()) << lease.status();
    leases.push_back(*lease);
  }
  auto full = registry.Register(Replica("rollout-3", v1::REPLICA_ROLE_ROLLOUT), {});
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  EXPECT_TRUE(absl::StrContains(full.status().message(), "REPLICA_ROLE_ROLLOUT")) << full.status();
  // Another role has its own count; a registered id may register again.
  EXPECT_TRUE(registry.Register(Replica("reward-0", v1::REPLICA_ROLE_REWARD), {}).ok());
  EXPECT_TRUE(registry.Register(Replica("rollout-0", v1::REPLICA_ROLE_ROLLOUT), absl::Seconds(3)).ok());
  // A deregistered or expired id frees its place.
  ASSERT_TRUE(registry.Deregister("rollout-1", leases[1].lease_id).value());
  EXPECT_TRUE(registry.Register(Replica("rollout-3", v1::REPLICA_ROLE_ROLLOUT), {}).ok());
  EXPECT_EQ(registry.Register(Replica("rollout-4", v1::REPLICA_ROLE_ROLLOUT), {}).status().code(),
            absl::StatusCode::kResourceExhausted);
  clock_.Advance(absl::Seconds(4));  // rollout-2's lease (3 s) has expired; rollout-0's too
  EXPECT_TRUE(registry.Register(Replica("rollout-4", v1::REPLICA_ROLE_ROLLOUT), {}).ok());
  EXPECT_EQ(registry.List(v1::REPLICA_ROLE_ROLLOUT, false)->size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Backends, RegistryTest, ::testing::Values("memory://", "redis"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "redis" ? std::string("redis") : "memory";
                         });

TEST(OpenRegistry, BadRedisAddressesAreClearErrors) {
  common::FakeClock clock;
  EXPECT_EQ(OpenRegistry("redis://nohost", &clock).status().code(), absl::StatusCode::kInvalidArgument);
  // Nothing listens on port 1: UNAVAILABLE within the 2 s connect timeout.
  auto down = OpenRegistry("redis://127.0.0.1:1", &clock);
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable) << down.status();
}

TEST(RedisRegistry, ReconnectsAfterARedisRestart) {
  // Its own redis-server on a free loopback port, so that restarting it disturbs nobody.
  int port = 0;
  {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    close(fd);
  }
  const std::string dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  auto start_redis = [&](rlfleet::testing::Subprocess& p) {
    ASSERT_TRUE(p.Start({"/usr/bin/redis-server", "--bind", "127.0.0.1", "--port", std::to_string(port), "--save", "",
                         "--appendonly", "no", "--dir", dir})
                    .ok());
    ASSERT_TRUE(p.WaitForLine([](const std::string& l) { return absl::StrContains(l, "Ready to accept connections"); },
                              absl::Seconds(20))
                    .ok());
  };
  common::FakeClock clock;
  auto server = std::make_unique<rlfleet::testing::Subprocess>();
  start_redis(*server);
  auto registry = OpenRegistry(absl::StrCat("redis://127.0.0.1:", port), &clock);
  ASSERT_TRUE(registry.ok()) << registry.status();
  auto lease = (*registry)->Register(Replica("rollout-7", v1::REPLICA_ROLE_ROLLOUT), {});
  ASSERT_TRUE(lease.ok()) << lease.status();

  // Redis goes away: calls fail fast with UNAVAILABLE, no hang.
  ASSERT_TRUE(server->Signal(SIGKILL).ok());
  ASSERT_TRUE(server->Wait(absl::Seconds(10)).ok());
  auto during = (*registry)->Heartbeat("rollout-7", lease->lease_id, {}, {});
  EXPECT_EQ(during.status().code(), absl::StatusCode::kUnavailable) << during.status();

  // Redis is back (empty, its scripts gone too): the next heartbeat reconnects and says
  // NOT_FOUND, so the replica registers again at once; heartbeats then work again
  // (the heartbeat script is sent again when Redis answers NOSCRIPT).
  server = std::make_unique<rlfleet::testing::Subprocess>();
  start_redis(*server);
  auto after = (*registry)->Heartbeat("rollout-7", lease->lease_id, {}, {});
  EXPECT_EQ(after.status().code(), absl::StatusCode::kNotFound) << after.status();
  auto again = (*registry)->Register(Replica("rollout-7", v1::REPLICA_ROLE_ROLLOUT), {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*registry)->List(v1::REPLICA_ROLE_ROLLOUT, false)->size(), 1u);
  v1::PolicyVersion version;
  version.set_version(3);
  auto beat = (*registry)->Heartbeat("rollout-7", again->lease_id, {}, version);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_TRUE(beat->admitted);
}

TEST(ClampLoad, BringsAnyLoadIntoTheAcceptedRanges) {
  v1::LoadStats load;
  load.set_utilization(std::numeric_limits<double>::quiet_NaN());
  load.set_tokens_per_s(std::numeric_limits<double>::infinity());
  load.set_queued_requests(~uint32_t{0});
  load.set_memory_used_bytes(~uint64_t{0});
  load.set_active_sequences(7);
  EXPECT_FALSE(ValidateLoad(load, "load").ok());
  ClampLoad(&load);
  EXPECT_TRUE(ValidateLoad(load, "load").ok());
  EXPECT_EQ(load.utilization(), 0);
  EXPECT_EQ(load.tokens_per_s(), 0);
  EXPECT_EQ(load.queued_requests(), kMaxLoadCount);
  EXPECT_EQ(load.memory_used_bytes(), kMaxMemoryBytes);
  EXPECT_EQ(load.active_sequences(), 7u);
  load.set_utilization(1.7);
  ClampLoad(&load);
  EXPECT_EQ(load.utilization(), 1.0);
}

TEST(OpenRegistry, UnknownSchemeIsInvalidArgument) {
  common::FakeClock clock;
  auto r = OpenRegistry("etcd://x", &clock);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "etcd://x"));
}

}  // namespace
}  // namespace rlfleet::registry

// The Registrar against a RegistryService backed by a redis-server of the test's own
// (random loopback port), stopped and restarted on the same port: a lease lost while
// Redis was away is registered again, the replica is admitted again, and the replica is
// told (so a drained rollout replica resumes).
#include "libs/registry/registrar.h"

#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/registry/registry.h"
#include "libs/rpc/server_runner.h"
#include "libs/rpc/status_conversion.h"
#include "tests/util/subprocess.h"

namespace rlfleet::registry {
namespace {

// What the controller's RegistryService does with Register / Heartbeat / Deregister,
// over any Registry.
class RegistryServiceOver final : public v1::RegistryService::Service {
 public:
  explicit RegistryServiceOver(Registry* registry) : registry_(registry) {}
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override {
    auto lease = registry_->Register(request->replica(), absl::Milliseconds(request->ttl_ms()));
    if (!lease.ok()) return rpc::ToGrpcStatus(lease.status());
    response->set_lease_id(lease->lease_id);
    response->set_ttl_ms(absl::ToInt64Milliseconds(lease->ttl));
    response->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(lease->ttl) / 3);
    *response->mutable_replica() = lease->replica;
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    auto beat =
        registry_->Heartbeat(request->replica_id(), request->lease_id(), request->load(), request->policy_version());
    if (!beat.ok()) return rpc::ToGrpcStatus(beat.status());
    response->set_ttl_ms(absl::ToInt64Milliseconds(beat->ttl));
    response->set_admitted(beat->admitted);
    return grpc::Status::OK;
  }
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest* request,
                          v1::DeregisterResponse* response) override {
    auto removed = registry_->Deregister(request->replica_id(), request->lease_id());
    if (!removed.ok()) return rpc::ToGrpcStatus(removed.status());
    response->set_was_registered(*removed);
    return grpc::Status::OK;
  }

 private:
  Registry* const registry_;
};

class RegistrarRedisRestart : public ::testing::Test {
 protected:
  void StartRedis() {
    redis_ = std::make_unique<testing::Subprocess>();
    const std::string dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
    ASSERT_TRUE(redis_
                    ->Start({"/usr/bin/redis-server", "--bind", "127.0.0.1", "--port", std::to_string(port_), "--save",
                             "", "--appendonly", "no", "--dir", dir})
                    .ok());
    ASSERT_TRUE(redis_
                    ->WaitForLine([](const std::string& l) { return absl::StrContains(l, "Ready to accept"); },
                                  absl::Seconds(20))
                    .ok());
  }
  void StopRedis() {
    ASSERT_TRUE(redis_->Signal(SIGKILL).ok());
    ASSERT_TRUE(redis_->Wait(absl::Seconds(10)).ok());
  }
  const int port_ = rlfleet::testing::FreeLoopbackPort();
  std::unique_ptr<testing::Subprocess> redis_;
};

// A log that tests can wait on: the registrar says when a heartbeat failed.
class Lines {
 public:
  void Add(const std::string& line) {
    absl::MutexLock lock(&mu_);
    lines_.push_back(line);
  }
  bool WaitFor(const std::string& part, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& l : lines_) {
        if (absl::StrContains(l, part)) return true;
      }
      return false;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

TEST_F(RegistrarRedisRestart, ALeaseLostWhileRedisWasAwayIsRegisteredAgainAndTheReplicaIsTold) {
  StartRedis();
  auto registry = OpenRegistry(absl::StrCat("redis://127.0.0.1:", port_), common::Clock::Real());
  ASSERT_TRUE(registry.ok()) << registry.status();
  RegistryServiceOver service(registry->get());
  rpc::ServerRunner runner(rpc::ServerOptions{});
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());

  Registrar::Options options;
  options.client.target = runner.address();
  options.client.default_timeout = absl::Seconds(5);
  options.replica.set_role(v1::REPLICA_ROLE_ROLLOUT);
  options.replica.set_grpc_address("127.0.0.1:7000");
  options.ttl = absl::Seconds(1);
  Lines log;
  absl::Notification rejoined;
  auto registrar = Registrar::Start(
      options, [](v1::ReplicaInfo* r) { r->mutable_policy_version()->set_version(3); },
      [&log](const std::string& line) { log.Add(line); },
      [&rejoined] {
        if (!rejoined.HasBeenNotified()) rejoined.Notify();
      });
  ASSERT_TRUE(registrar.ok()) << registrar.status();
  const std::string id = (*registrar)->replica_id();
  auto listed = (*registry)->List(v1::REPLICA_ROLE_ROLLOUT, /*only_admitted=*/true);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].replica_id(), id);

  // Redis goes away: heartbeats fail (and are retried), the lease goes with Redis.
  StopRedis();
  ASSERT_TRUE(log.WaitFor("(retrying)", absl::Seconds(30)));
  EXPECT_EQ((*registrar)->rejoins(), 0);

  // Redis is back (empty, the same port): the registrar registers again under a new
  // lease, the replica is admitted again and is told.
  StartRedis();
  ASSERT_TRUE(rejoined.WaitForNotificationWithTimeout(absl::Seconds(30))) << "never registered again";
  EXPECT_GE((*registrar)->rejoins(), 1);
  listed = (*registry)->List(v1::REPLICA_ROLE_ROLLOUT, /*only_admitted=*/true);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].replica_id(), id);
  EXPECT_TRUE((*listed)[0].admitted());
  registrar->reset();  // deregisters
  EXPECT_TRUE((*registry)->List(v1::REPLICA_ROLE_ROLLOUT, false)->empty());
}

}  // namespace
}  // namespace rlfleet::registry

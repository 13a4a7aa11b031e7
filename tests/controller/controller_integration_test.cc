// Proof of the chain: the real rlfleet-controller binary, started on a random loopback
// port, called by the real client (and the rlfleet CLI), with auth off and on, then
// stopped by SIGTERM.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/common/ids.h"
#include "services/controller/controller_client.h"
#include "tests/util/redis_for_test.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

using controller::ControllerClient;
using testing::RunfilePath;
using testing::Subprocess;

constexpr char kListening[] = "rlfleet-controller listening on ";

// Starts the controller with `extra` flags and returns its address.
std::string StartController(Subprocess& process, const std::vector<std::string>& extra) {
  auto address = testing::StartService(process, "services/controller/rlfleet-controller", extra, absl::Seconds(30));
  EXPECT_TRUE(address.ok()) << address.status();
  EXPECT_TRUE(absl::StrContains(process.output(), kListening)) << process.output();
  EXPECT_TRUE(absl::StrContains(process.output(), "rlfleet-controller metrics on http://127.0.0.1:"))
      << process.output();
  return address.ok() ? *address : "";
}

std::unique_ptr<ControllerClient> Connect(const std::string& address, std::string token = "") {
  rpc::ClientOptions options;
  options.target = address;
  options.auth.token = std::move(token);
  options.default_timeout = absl::Seconds(5);
  auto client = ControllerClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(*client);
}

v1::RegisterRequest RolloutRegistration(const std::string& id) {
  v1::RegisterRequest request;
  request.mutable_replica()->set_replica_id(id);
  request.mutable_replica()->set_role(v1::REPLICA_ROLE_ROLLOUT);
  request.mutable_replica()->set_grpc_address("127.0.0.1:9999");
  request.set_ttl_ms(30000);
  return request;
}

void ExpectCleanExitOnSigterm(Subprocess& process) {
  ASSERT_TRUE(process.Signal(SIGTERM).ok());
  auto status = process.Wait(absl::Seconds(20));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status)) << process.output();
  EXPECT_EQ(WEXITSTATUS(*status), 0) << process.output();
  EXPECT_TRUE(absl::StrContains(process.output(), "rlfleet-controller stopped on signal"));
}

TEST(ControllerBinary, ServesRegistryStatusAndHealthThenStopsOnSigterm) {
  Subprocess process;
  const std::string address = StartController(process, {});
  ASSERT_FALSE(address.empty());
  auto client = Connect(address);

  auto health = client->CheckHealth();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(health->status(), grpc::health::v1::HealthCheckResponse::SERVING);

  auto lease = client->Register(RolloutRegistration("rollout-0"));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->ttl_ms(), 30000);
  EXPECT_EQ(lease->heartbeat_interval_ms(), 10000);
  EXPECT_FALSE(lease->replica().admitted());

  v1::HeartbeatRequest beat;
  beat.set_replica_id("rollout-0");
  beat.set_lease_id(lease->lease_id());
  beat.mutable_policy_version()->set_version(1);
  auto beat_response = client->Heartbeat(beat);
  ASSERT_TRUE(beat_response.ok()) << beat_response.status();
  EXPECT_TRUE(beat_response->admitted());

  v1::ListReplicasRequest list;
  list.set_role(v1::REPLICA_ROLE_ROLLOUT);
  list.set_only_admitted(true);
  auto replicas = client->ListReplicas(list);
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  ASSERT_EQ(replicas->replicas_size(), 1);
  EXPECT_EQ(replicas->replicas(0).replica_id(), "rollout-0");
  EXPECT_EQ(replicas->replicas(0).policy_version().version(), 1u);

  auto status = client->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::RUN_STATE_IDLE);
  ASSERT_EQ(status->replicas_size(), 1);
  EXPECT_EQ(status->replicas(0).admitted(), 1u);

  // Bad input is a clear INVALID_ARGUMENT naming the field, and the server lives on.
  v1::RegisterRequest bad = RolloutRegistration("has space");
  auto rejected = client->Register(bad);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(rejected.status().message(), "replica.replica_id")) << rejected.status();
  v1::HeartbeatRequest stale = beat;
  stale.set_lease_id("lease-unknown");
  EXPECT_EQ(client->Heartbeat(stale).status().code(), absl::StatusCode::kNotFound);
  // Started without peer flags and with only a rollout replica registered, it runs no
  // loop and says what is missing.
  auto no_run = client->StartRun({});
  EXPECT_EQ(no_run.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(no_run.status().message(), "no reward service")) << no_run.status();
  EXPECT_TRUE(absl::StrContains(no_run.status().message(), "--reward")) << no_run.status();

  // The CLI against the same binary.
  Subprocess cli;
  ASSERT_TRUE(cli.Start({RunfilePath("services/controller/rlfleet"), "status", "--controller=" + address}).ok());
  auto cli_status = cli.Wait(absl::Seconds(20));
  ASSERT_TRUE(cli_status.ok());
  EXPECT_EQ(WEXITSTATUS(*cli_status), 0) << cli.output();
  EXPECT_TRUE(absl::StrContains(cli.output(), "SERVING")) << cli.output();
  EXPECT_TRUE(absl::StrContains(cli.output(), "rollout    registered 1  admitted 1")) << cli.output();

  ExpectCleanExitOnSigterm(process);
}

TEST(ControllerBinary, AuthOnFromAConfigFileRejectsCallsWithoutTheToken) {
  const std::string dir = getenv("TEST_TMPDIR");
  const std::string token_file = dir + "/token";
  const std::string config = dir + "/controller.conf";
  std::ofstream(token_file) << "t0ken-123\n";
  std::ofstream(config) << "# controller config\nauth_token_file = " << token_file << "\ndrain_timeout = 5s\n";
  Subprocess process;
  const std::string address = StartController(process, {"--config=" + config});
  ASSERT_FALSE(address.empty());
  EXPECT_TRUE(absl::StrContains(process.output(), "bearer token required"));

  auto anonymous = Connect(address)->Register(RolloutRegistration("rollout-1"));
  EXPECT_EQ(anonymous.status().code(), absl::StatusCode::kUnauthenticated) << anonymous.status();
  auto wrong = Connect(address, "nope")->GetStatus();
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated);

  auto authed = Connect(address, "t0ken-123");
  auto lease = authed->Register(RolloutRegistration("rollout-1"));
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto status = authed->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->replicas(0).registered(), 1u);

  // Health probes work without a token.
  auto health = Connect(address)->CheckHealth();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(health->status(), grpc::health::v1::HealthCheckResponse::SERVING);

  ExpectCleanExitOnSigterm(process);
}

TEST(ControllerBinary, RedisRegistrySurvivesAControllerRestart) {
  absl::StatusOr<int> redis_port = rlfleet::testing::RedisPortForTest();
  ASSERT_TRUE(redis_port.ok()) << redis_port.status();
  const std::string port = std::to_string(*redis_port);
  const std::string registry = absl::StrCat("--registry=redis://127.0.0.1:", port, "/", common::NewId("it"), ":");
  std::string lease_id;
  {
    Subprocess first;
    const std::string address = StartController(first, {registry, "--scaler=launcher"});
    ASSERT_FALSE(address.empty());
    auto lease = Connect(address)->Register(RolloutRegistration("rollout-r"));
    ASSERT_TRUE(lease.ok()) << lease.status();
    lease_id = lease->lease_id();
    v1::ScaleRequest scale;
    scale.set_role(v1::REPLICA_ROLE_ROLLOUT);
    scale.set_target_count(3);
    ASSERT_TRUE(Connect(address)->Scale(scale).ok());
    ExpectCleanExitOnSigterm(first);
  }
  // A new controller process sees the replica, and its lease still renews.
  Subprocess second;
  const std::string address = StartController(second, {registry, "--scaler=launcher"});
  ASSERT_FALSE(address.empty());
  auto client = Connect(address);
  v1::ListReplicasRequest list;
  auto replicas = client->ListReplicas(list);
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  ASSERT_EQ(replicas->replicas_size(), 1);
  EXPECT_EQ(replicas->replicas(0).replica_id(), "rollout-r");
  v1::HeartbeatRequest beat;
  beat.set_replica_id("rollout-r");
  beat.set_lease_id(lease_id);
  EXPECT_TRUE(client->Heartbeat(beat).ok());
  // The desired count it was given before (Scale) holds too: the launcher or autoscaler
  // goes on acting on it (it used to be forgotten: none reported).
  auto status = client->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  bool found = false;
  for (const v1::RoleSummary& role : status->replicas()) {
    if (role.role() != v1::REPLICA_ROLE_ROLLOUT) continue;
    found = true;
    EXPECT_EQ(role.desired(), 3u);
  }
  EXPECT_TRUE(found) << status->DebugString();
  ExpectCleanExitOnSigterm(second);
}

TEST(ControllerBinary, BadFlagsExitWithAClearMessage) {
  Subprocess process;
  ASSERT_TRUE(process.Start({RunfilePath("services/controller/rlfleet-controller"), "--registry=etcd://nowhere"}).ok());
  auto status = process.Wait(absl::Seconds(20));
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(WEXITSTATUS(*status), 2);
  EXPECT_TRUE(absl::StrContains(process.output(), "unknown registry `etcd://nowhere`")) << process.output();
}

// Issue 18: `rlfleet try` without --rollout aborted (a StatusOr of a channel to "" was
// dereferenced). Missing or out-of-range flags are usage errors: a message naming the
// flag, exit code 2, never a signal.
TEST(Cli, MissingOrBadFlagsAreUsageErrorsNotAborts) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"try"}, "--rollout is required"},
      {{"try", "--reward=127.0.0.1:1"}, "--rollout is required"},
      {{"try", "--rollout=127.0.0.1:1"}, "--reward is required"},
      {{"try", "--rollout=127.0.0.1:1", "--reward=127.0.0.1:1", "--samples=-1"}, "--samples=-1 is outside 1..64"},
      {{"train"}, "--trainer is required"},
      {{"train", "--trainer=127.0.0.1:1", "--groups=0"}, "--groups=0 is outside 1..1024"},
      // The command table: an unknown command is named; a missing or extra argument is
      // a usage error listing every command with its argument.
      {{"frobnicate"}, "unknown command `frobnicate` (status, replicas, health"},
      {{"scale"}, "|scale ROLE=N|"},
      {{"nccl-log"}, "|nccl-log FILE|"},
      {{"tokenize"}, "--model_dir is required"},
      {{"status", "extra"}, "usage: rlfleet status|replicas|"},
  };
  for (const Case& k : cases) {
    Subprocess cli;
    std::vector<std::string> argv = {RunfilePath("services/controller/rlfleet")};
    argv.insert(argv.end(), k.args.begin(), k.args.end());
    ASSERT_TRUE(cli.Start(argv).ok());
    auto status = cli.Wait(absl::Seconds(20));
    ASSERT_TRUE(status.ok());
    ASSERT_TRUE(WIFEXITED(*status)) << "killed by signal " << WTERMSIG(*status) << ": " << cli.output();
    EXPECT_EQ(WEXITSTATUS(*status), 2) << cli.output();
    EXPECT_TRUE(absl::StrContains(cli.output(), k.says)) << cli.output();
    EXPECT_TRUE(absl::StrContains(cli.output(), "usage: rlfleet")) << cli.output();
  }
}

TEST(ControllerBinary, WatchReplicasStreamsChangesAndEndsOnCancel) {
  Subprocess process;
  const std::string address = StartController(process, {});
  ASSERT_FALSE(address.empty());
  auto client = Connect(address);
  ASSERT_TRUE(client->Register(RolloutRegistration("rollout-a")).ok());

  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::RegistryService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::WatchReplicasRequest request;
  request.set_role(v1::REPLICA_ROLE_ROLLOUT);
  request.set_send_snapshot(true);
  auto reader = stub->WatchReplicas(&context, request);
  v1::ReplicaEvent event;
  // The snapshot, then what happens after.
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.type(), v1::REPLICA_EVENT_TYPE_ADDED);
  EXPECT_EQ(event.replica().replica_id(), "rollout-a");
  auto lease = client->Register(RolloutRegistration("rollout-b"));
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.type(), v1::REPLICA_EVENT_TYPE_ADDED);
  EXPECT_EQ(event.replica().replica_id(), "rollout-b");
  v1::DeregisterRequest gone;
  gone.set_replica_id("rollout-b");
  gone.set_lease_id(lease->lease_id());
  ASSERT_TRUE(client->Deregister(gone).ok());
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.type(), v1::REPLICA_EVENT_TYPE_REMOVED);
  EXPECT_EQ(event.replica().replica_id(), "rollout-b");
  EXPECT_GT(event.revision(), 0u);
  context.TryCancel();
  while (reader->Read(&event)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);

  // A bad request is a clear error on the stream.
  grpc::ClientContext bad_context;
  v1::WatchReplicasRequest bad;
  bad.set_role(static_cast<v1::ReplicaRole>(99));
  auto bad_reader = stub->WatchReplicas(&bad_context, bad);
  EXPECT_FALSE(bad_reader->Read(&event));
  grpc::Status bad_status = bad_reader->Finish();
  EXPECT_EQ(bad_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(bad_status.error_message(), "role 99")) << bad_status.error_message();

  ASSERT_TRUE(process.Signal(SIGTERM).ok());
  auto exit = process.Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.ok());
  EXPECT_EQ(WEXITSTATUS(*exit), 0) << process.output();
}

}  // namespace
}  // namespace rlfleet

// ControllerService's StartRun / StopRun through the real gRPC adapter on a loopback
// server, over fake peers: run ids are path-safe ids (nothing is created outside the
// runs folder, no shell ever sees one), every run field is honoured or refused naming
// it, and checkpoints are saved where StopRun asks.
#include "services/controller/controller_service.h"

#include <grpcpp/create_channel.h>

#include <cstdlib>
#include <filesystem>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/common/ids.h"
#include "libs/registry/registry.h"
#include "libs/rpc/server_runner.h"
#include "rlfleet/v1/controller.grpc.pb.h"
#include "services/controller/controller_core.h"
#include "services/controller/run_manager.h"
#include "services/controller/tests/fake_peers.h"

namespace rlfleet::controller {
namespace {

namespace fs = std::filesystem;

// Which rewards the next run's fake reward service gives.
FakeReward::Mode next_reward = FakeReward::Mode::kAlternate;

// A controller on a loopback port whose runs use fake peers (one rollout replica) and
// write into a fresh runs folder.
class ControllerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    next_reward = FakeReward::Mode::kAlternate;
    root_ = fs::path(std::getenv("TEST_TMPDIR")) / common::NewId("t");
    runs_dir_ = root_ / "runs";
    fs::create_directories(runs_dir_);
    registry_ = *registry::OpenRegistry("memory://", common::Clock::Real());
    core_ = std::make_unique<ControllerCore>(registry_.get(), common::Clock::Real());
    runs_ = std::make_unique<RunManager>(
        []() -> absl::StatusOr<RunPeers> {
          RunPeers peers;
          peers.rollouts.push_back(std::make_unique<FakeRollout>("a"));
          peers.reward = std::make_unique<FakeReward>(next_reward);
          auto buffer = std::make_unique<FakeBuffer>();
          peers.trainer = std::make_unique<FakeTrainer>(buffer.get());
          peers.buffer = std::move(buffer);
          return peers;
        },
        nullptr, runs_dir_.string());
    service_ = std::make_unique<ControllerServiceImpl>(core_.get(), runs_.get(), rpc::CallAuth{});
    runner_ = std::make_unique<rpc::ServerRunner>(rpc::ServerOptions{});
    runner_->AddService(service_.get());
    ASSERT_TRUE(runner_->Start().ok());
    stub_ = v1::ControllerService::NewStub(grpc::CreateChannel(runner_->address(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    runner_->Shutdown();
    runs_.reset();
  }

  grpc::Status StartRun(const v1::RunConfig& config, const std::string& run_id, v1::StartRunResponse* response) {
    v1::StartRunRequest request;
    *request.mutable_config() = config;
    request.set_run_id(run_id);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub_->StartRun(&context, request, response);
  }
  grpc::Status StopRun(const v1::StopRunRequest& request, v1::StopRunResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return stub_->StopRun(&context, request, response);
  }
  v1::GetStatusResponse Status() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetStatusResponse response;
    EXPECT_TRUE(stub_->GetStatus(&context, {}, &response).ok());
    return response;
  }
  // A small bounded run.
  static v1::RunConfig Small(uint64_t steps = 2) {
    v1::RunConfig c;
    c.set_total_steps(steps);
    c.set_batch_size(2);
    c.set_group_size(2);
    return c;
  }
  // Waits for the run to end: StopRun with a grace period is the wait (OK for a run
  // that already ended).
  v1::StopRunResponse WaitForEnd() {
    v1::StopRunResponse stopped;
    v1::GetStatusResponse s = Status();
    while (s.state() == v1::RUN_STATE_STARTING || s.state() == v1::RUN_STATE_RUNNING) {
      absl::SleepFor(absl::Milliseconds(5));
      s = Status();
    }
    stopped.set_state(s.state());
    return stopped;
  }

  fs::path root_, runs_dir_;
  std::unique_ptr<registry::Registry> registry_;
  std::unique_ptr<ControllerCore> core_;
  std::unique_ptr<RunManager> runs_;
  std::unique_ptr<ControllerServiceImpl> service_;
  std::unique_ptr<rpc::ServerRunner> runner_;
  std::unique_ptr<v1::ControllerService::Stub> stub_;
};

TEST_F(ControllerServiceTest, RunIdsThatAreNotPathSafeAreRefusedAndCreateNothing) {
  const fs::path marker = root_ / "pwned";
  const std::vector<std::string> bad = {
      "../x",
      "..",
      ".",
      ".hidden",
      "a/b",
      "/tmp/abs",
      "a'; touch " + marker.string() + "; '",
      "$(touch " + marker.string() + ")",
      "x\ny",
      std::string(129, 'a'),
      std::string("nul\0byte", 8),
  };
  for (const std::string& id : bad) {
    v1::StartRunResponse response;
    grpc::Status s = StartRun(Small(), id, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id << ": " << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), "run_id")) << s.error_message();
  }
  EXPECT_TRUE(fs::is_empty(runs_dir_));
  EXPECT_FALSE(fs::exists(root_ / "x"));
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_EQ(Status().state(), v1::RUN_STATE_IDLE);

  // A good id runs (its files in runs/<id>), and cannot be used again.
  v1::StartRunResponse response;
  grpc::Status s = StartRun(Small(), "good-1", &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.run_id(), "good-1");
  EXPECT_EQ(WaitForEnd().state(), v1::RUN_STATE_COMPLETED) << Status().error();
  EXPECT_TRUE(fs::exists(runs_dir_ / "good-1" / "metrics.csv"));
  s = StartRun(Small(), "good-1", &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "run_id")) << s.error_message();
  // Nothing but the good run's folder was made.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(runs_dir_)) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "good-1");
  }
  EXPECT_EQ(entries, 1);
  EXPECT_FALSE(fs::exists(marker));
}

TEST_F(ControllerServiceTest, EveryRunFieldIsHonouredOrRefusedNamingIt) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string field;
    std::function<void(v1::RunConfig&)> set;
    grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT;
  };
  const std::vector<Case> cases = {
      {"config.temperature", [&](v1::RunConfig& c) { c.set_temperature(nan); }},
      {"config.temperature", [&](v1::RunConfig& c) { c.set_temperature(-1); }},
      {"config.entropy_coef", [&](v1::RunConfig& c) { c.set_entropy_coef(nan); }},
      {"config.learning_rate", [&](v1::RunConfig& c) { c.set_learning_rate(nan); }},
      {"config.learning_rate", [&](v1::RunConfig& c) { c.set_learning_rate(-inf); }},
      {"config.clip_ratio", [&](v1::RunConfig& c) { c.set_clip_ratio(nan); }},
      {"config.clip_ratio_high", [&](v1::RunConfig& c) { c.set_clip_ratio_high(nan); }},
      {"config.clip_ratio_high", [&](v1::RunConfig& c) { c.set_clip_ratio_high(11); }},
      {"config.stop_at_exact_match", [&](v1::RunConfig& c) { c.set_stop_at_exact_match(nan); }},
      {"config.group_size", [&](v1::RunConfig& c) { c.set_group_size(4294967295u); }},
      {"config.group_size", [&](v1::RunConfig& c) { c.set_group_size(1); }},
      {"config.batch_size", [&](v1::RunConfig& c) { c.set_batch_size(2147483648u); }},
      {"config.total_steps", [&](v1::RunConfig& c) { c.set_total_steps(uint64_t{1} << 40); }},
      {"config.ppo_epochs", [&](v1::RunConfig& c) { c.set_ppo_epochs(2147483648u); }},
      {"config.max_staleness", [&](v1::RunConfig& c) { c.set_max_staleness(4294967295u); }},
      {"config.eval_interval_steps", [&](v1::RunConfig& c) { c.set_eval_interval_steps(4294967295u); }},
      {"config.max_new_tokens", [&](v1::RunConfig& c) { c.set_max_new_tokens(4294967295u); }},
      {"config.rollout_replicas", [&](v1::RunConfig& c) { c.set_rollout_replicas(4294967295u); }},
      {"config.checkpoint_interval_steps", [&](v1::RunConfig& c) { c.set_checkpoint_interval_steps(5); }},
      {"config.checkpoint_dir", [&](v1::RunConfig& c) { c.set_checkpoint_dir("ckpt/../../etc"); }},
      {"config.checkpoint_keep_last", [&](v1::RunConfig& c) { c.set_checkpoint_keep_last(4294967295u); }},
      {"config.task_params[depth]", [&](v1::RunConfig& c) { (*c.mutable_task_params())["depth"] = "3"; }},
      {"task", [&](v1::RunConfig& c) { c.set_task("juggle"); }},
      {"config.model", [&](v1::RunConfig& c) { c.mutable_model()->set_d_model(64); }, grpc::StatusCode::UNIMPLEMENTED},
      {"config.algorithm", [&](v1::RunConfig& c) { c.set_algorithm(v1::ALGORITHM_PPO); },
       grpc::StatusCode::UNIMPLEMENTED},
      // Honoured: one replica is known, so a run that wants three cannot start.
      {"config.rollout_replicas", [&](v1::RunConfig& c) { c.set_rollout_replicas(3); },
       grpc::StatusCode::FAILED_PRECONDITION},
  };
  for (const Case& k : cases) {
    v1::RunConfig c = Small();
    k.set(c);
    v1::StartRunResponse response;
    grpc::Status s = StartRun(c, "", &response);
    EXPECT_EQ(s.error_code(), k.code) << k.field << ": " << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), k.field)) << k.field << ": " << s.error_message();
  }
  EXPECT_EQ(Status().state(), v1::RUN_STATE_IDLE);
  // What is honoured runs: the fields set, one replica wanted and known.
  v1::RunConfig c = Small();
  c.set_rollout_replicas(1);
  c.set_temperature(0.7f);
  c.set_clip_ratio(0.25f);
  c.set_clip_ratio_high(0.28f);
  c.set_max_new_tokens(12);
  c.set_seed(5);
  c.set_checkpoint_dir("ckpt");
  v1::StartRunResponse response;
  grpc::Status s = StartRun(c, "", &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(WaitForEnd().state(), v1::RUN_STATE_COMPLETED) << Status().error();
}

TEST_F(ControllerServiceTest, StopRunSavesACheckpointWhereTheRunSaysOrRefuses) {
  v1::StartRunResponse started;
  // Without a checkpoint_dir, StopRun with checkpoint is refused and the run goes on.
  ASSERT_TRUE(StartRun(Small(0), "no-dir", &started).ok());
  v1::StopRunRequest stop;
  stop.set_checkpoint(true);
  v1::StopRunResponse stopped;
  grpc::Status s = StopRun(stop, &stopped);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "checkpoint")) << s.error_message();
  EXPECT_NE(Status().state(), v1::RUN_STATE_STOPPED);
  stop.set_grace_ms(-1);
  stop.set_checkpoint(false);
  s = StopRun(stop, &stopped);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "grace_ms")) << s.error_message();
  stop.set_grace_ms(0);
  ASSERT_TRUE(StopRun(stop, &stopped).ok());
  EXPECT_EQ(stopped.state(), v1::RUN_STATE_STOPPED);
  EXPECT_EQ(stopped.checkpoint_path(), "");

  // With one, it saves after the last step, and says where.
  v1::RunConfig c = Small(0);
  c.set_checkpoint_dir("ckpt");
  ASSERT_TRUE(StartRun(c, "with-dir", &started).ok());
  while (Status().step() < 2) absl::SleepFor(absl::Milliseconds(5));
  stop.set_checkpoint(true);
  s = StopRun(stop, &stopped);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(stopped.state(), v1::RUN_STATE_STOPPED) << Status().error();
  EXPECT_EQ(stopped.checkpoint_path(), absl::StrCat("ckpt/with-dir-step-", stopped.step()));
  // Idempotent: asked again, the same answer.
  v1::StopRunResponse again;
  ASSERT_TRUE(StopRun(stop, &again).ok());
  EXPECT_EQ(again.checkpoint_path(), stopped.checkpoint_path());
}

// A run that went its length without training anything ends FAILED, saying why.
TEST_F(ControllerServiceTest, ARunThatTrainedNothingFails) {
  next_reward = FakeReward::Mode::kConstant;
  v1::StartRunResponse started;
  ASSERT_TRUE(StartRun(Small(3), "idle", &started).ok());
  EXPECT_EQ(WaitForEnd().state(), v1::RUN_STATE_FAILED);
  const v1::GetStatusResponse status = Status();
  EXPECT_TRUE(absl::StrContains(status.error(), "every one of the 3 steps was idle")) << status.error();
}

// With roles on, starting, stopping and scaling runs is the controller role's: a fleet
// member's token reads status but cannot start a run; the admin token can.
TEST_F(ControllerServiceTest, RunRpcsNeedTheControllerRoleWhenRolesAreOn) {
  ControllerServiceImpl guarded(core_.get(), runs_.get(), rpc::CallAuth{"fleet", "admin", {}});
  rpc::ServerRunner runner{rpc::ServerOptions{}};
  runner.AddService(&guarded);
  ASSERT_TRUE(runner.Start().ok());
  auto stub = v1::ControllerService::NewStub(grpc::CreateChannel(runner.address(), grpc::InsecureChannelCredentials()));
  auto context = [](const std::string& token) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    c->AddMetadata(rpc::kAuthorizationKey, "Bearer " + token);
    return c;
  };
  v1::StartRunRequest start;
  start.mutable_config()->set_total_steps(1);
  v1::StartRunResponse started;
  grpc::Status denied = stub->StartRun(context("fleet").get(), start, &started);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED) << denied.error_message();
  EXPECT_TRUE(absl::StrContains(denied.error_message(), "StartRun")) << denied.error_message();
  v1::ScaleRequest scale;
  scale.set_role(v1::REPLICA_ROLE_ROLLOUT);
  scale.set_target_count(2);
  v1::ScaleResponse scaled;
  EXPECT_EQ(stub->Scale(context("fleet").get(), scale, &scaled).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  v1::StopRunRequest stop;
  v1::StopRunResponse stopped;
  EXPECT_EQ(stub->StopRun(context("fleet").get(), stop, &stopped).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  v1::GetStatusResponse status;
  EXPECT_TRUE(stub->GetStatus(context("fleet").get(), v1::GetStatusRequest(), &status).ok());
  EXPECT_EQ(stub->GetStatus(context("guess").get(), v1::GetStatusRequest(), &status).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  grpc::Status ok = stub->StartRun(context("admin").get(), start, &started);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  runner.Shutdown();
}

// A reward replica that names its tasks takes every run's items of them: with roles on,
// only the controller role may register one; a plain registration needs the fleet token.
TEST_F(ControllerServiceTest, RewardTaskRoutesNeedTheControllerRoleWhenRolesAreOn) {
  RegistryServiceImpl guarded(core_.get(), rpc::CallAuth{"fleet", "admin", {}, "gateway"});
  rpc::ServerRunner runner{rpc::ServerOptions{}};
  runner.AddService(&guarded);
  ASSERT_TRUE(runner.Start().ok());
  auto stub = v1::RegistryService::NewStub(grpc::CreateChannel(runner.address(), grpc::InsecureChannelCredentials()));
  auto context = [](const std::string& token) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    c->AddMetadata(rpc::kAuthorizationKey, "Bearer " + token);
    return c;
  };
  v1::RegisterRequest route;
  route.mutable_replica()->set_replica_id("reward-worker-1");
  route.mutable_replica()->set_role(v1::REPLICA_ROLE_REWARD);
  route.mutable_replica()->set_grpc_address("127.0.0.1:7100");
  (*route.mutable_replica()->mutable_labels())["reward.tasks"] = "reverse";
  v1::RegisterResponse registered;
  grpc::Status denied = stub->Register(context("fleet").get(), route, &registered);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED) << denied.error_message();
  EXPECT_TRUE(absl::StrContains(denied.error_message(), "reward.tasks")) << denied.error_message();
  v1::ListReplicasResponse listed;
  ASSERT_TRUE(stub->ListReplicas(context("fleet").get(), v1::ListReplicasRequest(), &listed).ok());
  EXPECT_EQ(listed.replicas_size(), 0);

  grpc::Status ok = stub->Register(context("admin").get(), route, &registered);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  v1::RegisterRequest plain = route;
  plain.mutable_replica()->set_replica_id("reward-2");
  plain.mutable_replica()->clear_labels();
  ok = stub->Register(context("fleet").get(), plain, &registered);
  EXPECT_TRUE(ok.ok()) << ok.error_message();

  // The gateway's inference token reads the registry and does nothing else.
  ASSERT_TRUE(stub->ListReplicas(context("gateway").get(), v1::ListReplicasRequest(), &listed).ok());
  EXPECT_EQ(listed.replicas_size(), 2);
  plain.mutable_replica()->set_replica_id("reward-3");
  denied = stub->Register(context("gateway").get(), plain, &registered);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED) << denied.error_message();
  runner.Shutdown();
}

}  // namespace
}  // namespace rlfleet::controller

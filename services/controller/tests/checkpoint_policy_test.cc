// The run's checkpoints against a fake trainer: a periodic save that fails (a full disk)
// is counted and tried again at the next interval while the run goes on; the save at
// completion and StopRun's still fail; every save asks the trainer for the run's
// retention (checkpoint_keep_last, 3 unless set).
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/controller/run_loop.h"
#include "services/controller/run_manager.h"
#include "services/controller/tests/fake_peers.h"

namespace rlfleet::controller {
namespace {

LoopConfig Config(int steps, bool fully_async) {
  LoopConfig c;
  c.run_id = "r";
  c.steps = steps;
  c.prompts = 4;
  c.samples = 2;
  c.eval_every = 0;
  c.held_out = 8;
  c.stop_at = 2.0;  // never stop early
  c.checkpoint_dir = "ckpt";
  c.checkpoint_every = 2;
  c.fully_async = fully_async;
  c.max_staleness = fully_async ? 1 : 0;
  return c;
}

std::vector<std::unique_ptr<RolloutReplica>> OneReplica() {
  std::vector<std::unique_ptr<RolloutReplica>> out;
  out.push_back(std::make_unique<FakeRollout>("a"));
  return out;
}

// The loop's peers, every group with a learning signal (so that both modes train each
// step); every step's progress kept.
struct Fleet {
  Fleet() { trainer.limit_to_num_groups = true; }
  absl::Status Run(const LoopConfig& config) {
    std::atomic<bool> stop{false};
    return RunLoop(config, pool, reward, buffer, trainer, stop,
                   [this](const LoopProgress& p) { progress.push_back(p); });
  }
  RolloutPool pool{OneReplica(), nullptr};
  FakeReward reward{FakeReward::Mode::kAlternate};
  FakeBuffer buffer;
  FakeTrainer trainer{&buffer};
  std::vector<LoopProgress> progress;
};

class CheckpointPolicyTest : public testing::TestWithParam<bool /* fully_async */> {};

TEST_P(CheckpointPolicyTest, AFailedPeriodicSaveIsCountedAndTheNextIntervalSaves) {
  Fleet run;
  run.trainer.failing_checkpoints = {"ckpt/r-step-2"};
  const absl::Status s = run.Run(Config(6, GetParam()));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(run.trainer.steps, 6);
  EXPECT_EQ(run.trainer.failed_checkpoints, std::vector<std::string>({"ckpt/r-step-2"}));
  EXPECT_EQ(run.trainer.checkpoints, std::vector<std::string>({"ckpt/r-step-4", "ckpt/r-step-6"}));
  ASSERT_EQ(run.progress.size(), 6u);
  EXPECT_EQ(run.progress[0].failed_checkpoints, 0);
  EXPECT_EQ(run.progress[1].failed_checkpoints, 1);  // (step 2's)
  EXPECT_EQ(run.progress[1].last_checkpoint, "");
  EXPECT_EQ(run.progress[3].last_checkpoint, "ckpt/r-step-4");
  EXPECT_EQ(run.progress.back().failed_checkpoints, 1);
  EXPECT_EQ(run.progress.back().last_checkpoint, "ckpt/r-step-6");
  // Each save asked for the default retention.
  EXPECT_EQ(run.trainer.keep_last, std::vector<uint32_t>({3, 3}));
}

TEST_P(CheckpointPolicyTest, TheLastPeriodicSaveFailingLeavesItToTheFinalSave) {
  Fleet run;
  run.trainer.failing_checkpoints = {"ckpt/r-step-4"};
  LoopConfig c = Config(5, GetParam());
  c.checkpoint_keep_last = 0;
  const absl::Status s = run.Run(c);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(run.trainer.checkpoints, std::vector<std::string>({"ckpt/r-step-2", "ckpt/r-step-5"}));
  EXPECT_EQ(run.progress.back().last_checkpoint, "ckpt/r-step-5");
  EXPECT_EQ(run.trainer.keep_last, std::vector<uint32_t>({0, 0}));
}

TEST_P(CheckpointPolicyTest, TheFinalSaveStillFailsTheRun) {
  Fleet run;
  run.trainer.failing_checkpoints = {"ckpt/r-step-5"};
  const absl::Status s = run.Run(Config(5, GetParam()));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "SaveCheckpoint ckpt/r-step-5")) << s;
  EXPECT_EQ(run.trainer.checkpoints, std::vector<std::string>({"ckpt/r-step-2", "ckpt/r-step-4"}));
}

INSTANTIATE_TEST_SUITE_P(SyncAndFullyAsync, CheckpointPolicyTest, testing::Bool());

TEST(CheckpointPolicy, KeepLastIsValidatedAndDefaultsToThree) {
  v1::RunConfig c;
  c.set_checkpoint_dir("ckpt");
  c.set_checkpoint_interval_steps(2);
  auto loop = LoopConfigFromRun(c);
  ASSERT_TRUE(loop.ok()) << loop.status();
  EXPECT_EQ(loop->checkpoint_keep_last, 3);
  c.set_checkpoint_keep_last(0);
  loop = LoopConfigFromRun(c);
  ASSERT_TRUE(loop.ok()) << loop.status();
  EXPECT_EQ(loop->checkpoint_keep_last, 0);
  c.set_checkpoint_keep_last(7);
  EXPECT_EQ(LoopConfigFromRun(c)->checkpoint_keep_last, 7);
  c.set_checkpoint_keep_last(kMaxCheckpointKeepLast + 1);
  loop = LoopConfigFromRun(c);
  EXPECT_EQ(loop.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(loop.status().message(), "config.checkpoint_keep_last")) << loop.status();
  LoopConfig bad;
  bad.checkpoint_keep_last = -1;
  EXPECT_EQ(ValidateLoopConfig(bad).code(), absl::StatusCode::kInvalidArgument);
}

// Waits up to 10 s for `condition` (polled: the run has no hook for a test).
bool Eventually(const std::function<bool()>& condition) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST(CheckpointPolicy, ARunGoesOnThroughFailedSavesAndStopRunReportsItsOwn) {
  RunManager runs(
      []() -> absl::StatusOr<RunPeers> {
        absl::StatusOr<RunPeers> peers = OneReplicaFakePeers();
        static_cast<FakeTrainer*>(peers->trainer.get())->fail_every_save = true;  // (a full disk)
        return peers;
      },
      nullptr);
  v1::RunConfig c;
  c.set_total_steps(0);  // until stopped
  c.set_batch_size(2);
  c.set_group_size(2);
  c.set_checkpoint_dir("ckpt");
  c.set_checkpoint_interval_steps(1);
  ASSERT_TRUE(runs.Start(c, "full-disk").ok());
  // Every step's save fails; the run keeps running and counts them.
  v1::GetStatusResponse status;
  ASSERT_TRUE(Eventually([&] {
    status.Clear();
    runs.Fill(&status);
    return status.metrics().failed_checkpoints() >= 3;
  })) << status.DebugString();
  EXPECT_EQ(status.state(), v1::RUN_STATE_RUNNING) << status.error();
  EXPECT_GE(status.step(), 3u);
  // StopRun with a checkpoint reports that its save failed.
  v1::StopRunResponse stopped;
  ASSERT_TRUE(runs.Stop("", true, absl::Seconds(30), &stopped).ok());
  EXPECT_EQ(stopped.state(), v1::RUN_STATE_FAILED);
  EXPECT_EQ(stopped.checkpoint_path(), "");
  status.Clear();
  runs.Fill(&status);
  EXPECT_TRUE(absl::StrContains(status.error(), "checkpoint at StopRun")) << status.error();
  EXPECT_TRUE(absl::StrContains(status.error(), "no space left on device")) << status.error();
}

}  // namespace
}  // namespace rlfleet::controller

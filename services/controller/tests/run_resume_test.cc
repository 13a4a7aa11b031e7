// A run survives its controller: the record a RunManager saves (run_store.h) lets a
// restarted controller resume the run after its last step, with the same ids (what the
// buffer stored before is not stored twice, and counts once), the same prompts as an
// uninterrupted run, and version numbers past every one its replicas hold (a trainer
// restarted from an older checkpoint never reuses one).
#include <atomic>
#include <memory>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/registry/registry.h"
#include "services/controller/controller_core.h"
#include "services/controller/run_loop.h"
#include "services/controller/run_manager.h"
#include "services/controller/run_store.h"
#include "services/controller/tests/fake_peers.h"

namespace rlfleet::controller {
namespace {

LoopConfig Config(int steps) {
  LoopConfig c;
  c.run_id = "run-resume";
  c.steps = steps;
  c.prompts = 4;
  c.samples = 2;
  c.eval_every = 0;
  c.stop_at = 2.0;
  return c;
}

std::vector<std::unique_ptr<RolloutReplica>> TwoReplicas(FakeRollout** a, FakeRollout** b) {
  std::vector<std::unique_ptr<RolloutReplica>> out;
  auto ra = std::make_unique<FakeRollout>("a");
  auto rb = std::make_unique<FakeRollout>("b");
  *a = ra.get();
  *b = rb.get();
  out.push_back(std::move(ra));
  out.push_back(std::move(rb));
  return out;
}

TEST(RunResume, GoesOnAfterItsLastStepWithTheSamePromptsAndStoresNothingTwice) {
  // The reference: 6 steps without interruption.
  FakeRollout *a = nullptr, *b = nullptr;
  FakeRun reference(TwoReplicas(&a, &b));
  ASSERT_TRUE(reference.Run(Config(6)).ok());

  // The controller dies during step 4: the record says step 3, but step 4's
  // experiences reached the buffer already.
  FakeRun run(TwoReplicas(&a, &b));
  ASSERT_TRUE(run.RunUntil(Config(6), [](const LoopProgress& p) { return p.step == 4; }).ok());
  ASSERT_EQ(run.progress.size(), 4u);
  const LoopProgress record = run.progress[2];  // step 3
  EXPECT_EQ(record.accepted_experiences, 3u * 4 * 2);
  EXPECT_GT(record.published_version, 0u);
  EXPECT_FALSE(record.tag.empty());

  // The restarted controller's loop: over the same peers, from the record.
  LoopConfig resumed = Config(6);
  resumed.resume = record;
  run.progress.clear();
  absl::Status s = run.Run(resumed);
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<LoopProgress>& after = run.progress;
  ASSERT_EQ(after.size(), 3u);  // steps 4, 5, 6
  EXPECT_EQ(after.front().step, 4);
  EXPECT_EQ(after.back().step, 6);
  EXPECT_EQ(after.back().tag, record.tag);
  // Step 4 again: its experiences were duplicates (stored by the first attempt) and
  // count once; the buffer holds each experience once.
  EXPECT_EQ(run.buffer.duplicates, 4 * 2);
  EXPECT_EQ(run.buffer.experiences, 6 * 4 * 2);
  EXPECT_EQ(after.back().accepted_experiences, 6u * 4 * 2);
  // The same prompts as the uninterrupted run, step by step (step 4's twice).
  const std::vector<std::string>& ref = reference.reward.scored_prompts;
  ASSERT_EQ(ref.size(), 6u * 4 * 2);
  std::vector<std::string> expected(ref.begin(), ref.begin() + 4 * 4 * 2);
  expected.insert(expected.end(), ref.begin() + 3 * 4 * 2, ref.end());
  ASSERT_EQ(run.reward.scored_prompts.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(run.reward.scored_prompts[i], expected[i]) << "item " << i;
  EXPECT_EQ(run.pool.live(), 2);
}

TEST(RunResume, ATrainerBehindTheReplicasPublishesUnderANewNumber) {
  FakeRollout *a = nullptr, *b = nullptr;
  FakeRun run(TwoReplicas(&a, &b));
  FakeTrainer& trainer = run.trainer;
  ASSERT_TRUE(run.Run(Config(3)).ok());
  const uint64_t served = a->version();
  ASSERT_EQ(served, trainer.version);
  // The trainer restarts from an older checkpoint: it is at version 2 with other weights.
  trainer.version = 2;
  // A new run (or a resumed one): the replicas keep serving and install a version past theirs.
  LoopConfig next = Config(2);
  next.run_id = "run-next";
  ASSERT_TRUE(run.Run(next).ok());
  EXPECT_EQ(run.pool.live(), 2);
  EXPECT_GT(a->version(), served);
  EXPECT_EQ(a->version(), b->version());
  EXPECT_EQ(a->version(), trainer.version);
  // Every publish after a trained step asked for a number past the installed one.
  EXPECT_EQ(trainer.last_min_version, a->version());
  // The trainer already ahead of the replicas publishes as it is (no new number).
  const int publishes = trainer.publishes;
  trainer.version = a->version();
  LoopConfig again = Config(1);
  again.run_id = "run-again";
  ASSERT_TRUE(run.Run(again).ok());
  EXPECT_EQ(trainer.publishes, publishes + 2);  // the start's and step 1's
}

TEST(RunResume, ARestartedControllerResumesTheRunFromItsRecord) {
  InMemoryRunStore store;
  v1::RunConfig config;
  config.set_total_steps(8);
  config.set_batch_size(2);
  config.set_group_size(2);
  std::string id;
  {
    // Slow replicas, so that the run is mid-way when this controller goes.
    auto peers = [] {
      RunPeers p = *OneReplicaFakePeers();
      p.rollouts.clear();
      p.rollouts.push_back(std::make_unique<FakeRollout>("a", -1, absl::OkStatus(), absl::Milliseconds(30)));
      return absl::StatusOr<RunPeers>(std::move(p));
    };
    RunManager runs(peers, nullptr, "", &store);
    ASSERT_TRUE(runs.Recover().ok());  // nothing to resume
    auto started = runs.Start(config, "run-a");
    ASSERT_TRUE(started.ok()) << started.status();
    id = *started;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    v1::GetStatusResponse status;
    while (status.step() < 2 && absl::Now() < deadline) {
      status.Clear();
      runs.Fill(&status);
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_GE(status.step(), 2u);
  }  // the controller stops: the run is left active in the store
  absl::StatusOr<std::optional<RunRecord>> left = store.Load();
  ASSERT_TRUE(left.ok() && left->has_value());
  EXPECT_EQ((*left)->state, v1::RUN_STATE_RUNNING);
  EXPECT_GE((*left)->progress.step, 2);
  EXPECT_LT((*left)->progress.step, 8);

  v1::GetStatusResponse status;
  {
    RunManager restarted(OneReplicaFakePeers, nullptr, "", &store);
    ASSERT_TRUE(restarted.Recover().ok());
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      status.Clear();
      restarted.Fill(&status);
      if (status.state() == v1::RUN_STATE_COMPLETED || status.state() == v1::RUN_STATE_FAILED) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
  }  // (its run's thread has saved the end)
  EXPECT_EQ(status.state(), v1::RUN_STATE_COMPLETED) << status.error();
  EXPECT_EQ(status.run_id(), id);
  EXPECT_EQ(status.step(), 8u);
  EXPECT_EQ(status.resumes(), 1u);
  EXPECT_EQ(status.metrics().experiences_accepted(), 8u * 2 * 2);
  // The ended run is in the record: the next controller reports it and resumes nothing.
  RunManager third(OneReplicaFakePeers, nullptr, "", &store);
  ASSERT_TRUE(third.Recover().ok());
  v1::GetStatusResponse last;
  third.Fill(&last);
  EXPECT_EQ(last.state(), v1::RUN_STATE_COMPLETED);
  EXPECT_EQ(last.run_id(), id);
  EXPECT_FALSE(third.HasActiveRun());
  EXPECT_EQ(third.Start(config, id).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(RunResume, ARunThatWasStoppingEndsStoppedAndABadRecordIsDataLoss) {
  InMemoryRunStore store;
  RunRecord record;
  record.run_id = "run-b";
  record.state = v1::RUN_STATE_STOPPING;
  record.stop_requested = true;
  record.progress.step = 3;
  ASSERT_TRUE(store.Save(record).ok());
  RunManager runs(OneReplicaFakePeers, nullptr, "", &store);
  ASSERT_TRUE(runs.Recover().ok());
  v1::GetStatusResponse status;
  runs.Fill(&status);
  EXPECT_EQ(status.state(), v1::RUN_STATE_STOPPED);
  EXPECT_EQ(status.step(), 3u);
  EXPECT_EQ((*store.Load())->state, v1::RUN_STATE_STOPPED);

  std::map<std::string, std::string> fields = RunRecordFields(record);
  EXPECT_TRUE(RunRecordFromFields(fields).ok());
  fields["step"] = "three";
  absl::Status bad = RunRecordFromFields(fields).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(bad.message(), "step")) << bad;
  fields = RunRecordFields(record);
  fields["format"] = "something-else";
  EXPECT_EQ(RunRecordFromFields(fields).status().code(), absl::StatusCode::kDataLoss);
}

TEST(RunResume, TheRecordSurvivesARoundTripThroughItsFields) {
  RunRecord r;
  r.run_id = "run-c";
  r.config.set_total_steps(40);
  r.config.set_checkpoint_dir("ckpt");
  r.state = v1::RUN_STATE_RUNNING;
  r.started_unix_ms = 1764600000123;
  r.run_dir = "/tmp/runs/run-c";
  r.last_exact = 0.625f;
  r.resumes = 2;
  r.progress.step = 17;
  r.progress.idle_steps = 3;
  r.progress.seconds = 12.5;
  r.progress.trained_sequences = 544;
  r.progress.accepted_experiences = 1088;
  r.progress.tag = "r-abc";
  r.progress.published_version = 15;
  r.progress.last_checkpoint = "ckpt/run-c-step-10";
  absl::StatusOr<RunRecord> back = RunRecordFromFields(RunRecordFields(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(RunRecordFields(*back), RunRecordFields(r));
}

// Desired counts (Scale) live in the run store: a second core over the same store (a
// restarted controller) reports them; a store that cannot save refuses the Scale and
// keeps the old count; a damaged entry is DATA_LOSS naming it.
// Reads `inner`'s counts; cannot save (Redis went away).
class FailingDesiredStore : public DesiredCountStore {
 public:
  explicit FailingDesiredStore(DesiredCountStore* inner) : inner_(inner) {}
  absl::Status SaveDesired(const std::map<int, uint32_t>&) override { return absl::UnavailableError("down"); }
  absl::StatusOr<std::map<int, uint32_t>> LoadDesired() override { return inner_->LoadDesired(); }

 private:
  DesiredCountStore* const inner_;
};

uint32_t DesiredOf(ControllerCore& core, v1::ReplicaRole role) {
  v1::GetStatusResponse status;
  EXPECT_TRUE(core.GetStatus({}, &status).ok());
  for (const v1::RoleSummary& r : status.replicas()) {
    if (r.role() == role) return r.desired();
  }
  return 0;
}

TEST(RunResume, DesiredCountsSurviveARestartedController) {
  auto registry = *registry::OpenRegistry("memory://", common::Clock::Real());
  InMemoryRunStore store;
  v1::ScaleRequest scale;
  scale.set_role(v1::REPLICA_ROLE_ROLLOUT);
  scale.set_target_count(4);
  v1::ScaleResponse scaled;
  {
    ControllerCore first(registry.get(), common::Clock::Real());
    first.SetScaler("launcher");
    ASSERT_TRUE(first.UseDesiredStore(&store).ok());
    ASSERT_TRUE(first.Scale(scale, &scaled).ok());
    scale.set_role(v1::REPLICA_ROLE_REWARD);
    scale.set_target_count(2);
    ASSERT_TRUE(first.Scale(scale, &scaled).ok());
  }
  ControllerCore second(registry.get(), common::Clock::Real());
  second.SetScaler("launcher");
  EXPECT_EQ(DesiredOf(second, v1::REPLICA_ROLE_ROLLOUT), 0u);  // (not yet: no store)
  ASSERT_TRUE(second.UseDesiredStore(&store).ok());
  EXPECT_EQ(DesiredOf(second, v1::REPLICA_ROLE_ROLLOUT), 4u);
  EXPECT_EQ(DesiredOf(second, v1::REPLICA_ROLE_REWARD), 2u);

  FailingDesiredStore failing(&store);
  ControllerCore third(registry.get(), common::Clock::Real());
  third.SetScaler("launcher");
  ASSERT_TRUE(third.UseDesiredStore(&failing).ok());
  scale.set_role(v1::REPLICA_ROLE_ROLLOUT);
  scale.set_target_count(9);
  absl::Status refused = third.Scale(scale, &scaled);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "desired counts")) << refused;
  EXPECT_EQ(DesiredOf(third, v1::REPLICA_ROLE_ROLLOUT), 4u);  // not 9: nothing changed

  std::map<std::string, std::string> fields = DesiredFields({{v1::REPLICA_ROLE_ROLLOUT, 3}});
  EXPECT_EQ(fields.at("REPLICA_ROLE_ROLLOUT"), "3");
  fields["REPLICA_ROLE_ROLLOUT"] = "2000";
  absl::Status bad = DesiredFromFields(fields).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
  EXPECT_TRUE(absl::StrContains(bad.message(), "REPLICA_ROLE_ROLLOUT")) << bad;
  EXPECT_EQ(DesiredFromFields({{"REPLICA_ROLE_NOPE", "1"}}).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace rlfleet::controller

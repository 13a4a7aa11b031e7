// What makes a run reproducible and readable: one seed fixes the prompt stream, the
// held-out set (never trained on) and every call's sampling seed whatever the timing;
// a synchronous run's rollouts go in whole calls; a fresh trainer is initialised from
// the seed; the run says whether it reached its target and when its policy collapsed.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "services/controller/learning_watch.h"
#include "services/controller/prompt_source.h"
#include "services/controller/run_loop.h"
#include "services/controller/run_manager.h"
#include "services/controller/tests/fake_peers.h"

namespace rlfleet::controller {
namespace {

std::vector<std::unique_ptr<RolloutReplica>> Pool1() {
  std::vector<std::unique_ptr<RolloutReplica>> out;
  out.push_back(std::make_unique<FakeRollout>("a"));
  return out;
}

LoopConfig Small() {
  LoopConfig c;
  c.steps = 4;
  c.prompts = 8;
  c.samples = 2;
  c.eval_every = 2;
  c.held_out = 16;
  c.stop_at = 2.0;  // never stop early
  return c;
}

std::vector<std::string> Texts(const std::vector<RunPrompt>& prompts) {
  std::vector<std::string> out;
  for (const RunPrompt& p : prompts) out.push_back(p.text);
  return out;
}

// The seed alone fixes the prompts: the same in every process (the stream used to come
// from an absl::BitGen, which salts its seed with the process's entropy), the held-out
// set distinct and never among the training prompts.
TEST(PromptSource, TheSeedFixesTheHeldOutSetAndTheStreamInEveryProcess) {
  LoopConfig c;
  c.seed = 11;
  auto a = NewPromptSource(c);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ((*a)->held_out().size(), 256u);  // the default
  const std::vector<std::string> held = Texts((*a)->held_out());
  EXPECT_EQ(std::set<std::string>(held.begin(), held.end()).size(), held.size());
  const std::vector<std::string> first = Texts((*a)->Next(3));
  // Values of this build's std::mt19937_64 and absl::Uniform: any process gives them.
  EXPECT_EQ(first, (std::vector<std::string>{"reverse:095", "reverse:420", "reverse:6597"}));
  EXPECT_EQ(held[0], "reverse:2420");
  const std::set<std::string> held_set(held.begin(), held.end());
  for (const std::string& t : Texts((*a)->Next(5000))) ASSERT_EQ(held_set.count(t), 0u) << t;
  auto b = NewPromptSource(c);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(Texts((*b)->held_out()), held);
  EXPECT_EQ(Texts((*b)->Next(3)), first);
  c.seed = 12;
  auto other = NewPromptSource(c);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(Texts((*other)->held_out()), held);
}

// Two runs of one seed, one replica slow: every call carries the same prompts with the
// same sampling seed (each chunk's own, from its first prompt), in one call per
// replica per step; another seed changes them.
TEST(RunLoop, OneSeedGivesTheSameCallsAndSeedsWhateverTheTiming) {
  auto calls = [](uint64_t seed, absl::Duration b_latency) {
    auto a = std::make_unique<FakeRollout>("a");
    auto b = std::make_unique<FakeRollout>("b", -1, absl::OkStatus(), b_latency);
    FakeRollout* pa = a.get();
    FakeRollout* pb = b.get();
    std::vector<std::unique_ptr<RolloutReplica>> replicas;
    replicas.push_back(std::move(a));
    replicas.push_back(std::move(b));
    FakeRun run(std::move(replicas));
    LoopConfig c = Small();
    c.seed = seed;
    EXPECT_TRUE(run.Run(c).ok());
    std::map<std::string, std::pair<uint64_t, int>> all = pa->seeds();
    for (const auto& [prompt, call] : pb->seeds()) all[prompt] = call;
    return std::make_pair(all, run.reward.scored_prompts);
  };
  const auto [calls1, scored1] = calls(5, absl::ZeroDuration());
  const auto [calls2, scored2] = calls(5, absl::Milliseconds(30));
  EXPECT_EQ(calls1, calls2);
  EXPECT_EQ(scored1, scored2);
  // Whole calls: 4 steps x 2 replicas, and 2 evaluations x 2 replicas, each of 4 or 8 prompts.
  int training_calls = 0;
  std::set<uint64_t> seeds;
  for (const auto& [prompt, call] : calls1) {
    training_calls += call.second == 4;
    seeds.insert(call.first);
  }
  EXPECT_EQ(training_calls, 8);
  EXPECT_GE(seeds.size(), 8u);  // no two training calls share a random stream
  const auto [calls3, scored3] = calls(6, absl::ZeroDuration());
  EXPECT_NE(scored1, scored3);
}

TEST(RunLoop, AFreshTrainerIsInitialisedFromTheRunsSeed) {
  FakeRun run(Pool1());
  run.trainer.init_failure = absl::OkStatus();
  LoopConfig c = Small();
  c.seed = 42;
  ASSERT_TRUE(run.Run(c).ok());
  EXPECT_EQ(run.trainer.init_seeds, (std::vector<uint64_t>{42}));
  EXPECT_EQ(run.progress.back().model_init, "initialised from seed 42");
  // A trainer that has trained keeps its weights, and the run says so.
  FakeRun trained(Pool1());
  trained.trainer.init_failure = absl::FailedPreconditionError("the trainer has taken 3 steps");
  ASSERT_TRUE(trained.Run(c).ok());
  EXPECT_TRUE(absl::StrContains(trained.progress.back().model_init, "the trainer's weights as they were"))
      << trained.progress.back().model_init;
  // Another error fails the run.
  FakeRun broken(Pool1());
  broken.trainer.init_failure = absl::InternalError("disk");
  EXPECT_EQ(broken.Run(c).code(), absl::StatusCode::kInternal);
}

LoopProgress Step(int step, float entropy, std::optional<double> exact = std::nullopt) {
  LoopProgress p;
  p.step = step;
  p.entropy = entropy;
  p.held_out_exact = exact;
  p.zero_variance_share = 0.9;
  return p;
}

TEST(LearningWatch, ACollapseIsReportedOnceAfterTenStepsUnderTheFloorBelowTarget) {
  LearningWatch watch(0.8, 0.05);
  LoopProgress p;
  std::vector<std::string> warnings;
  for (int step = 1; step <= 30; ++step) {
    const LoopProgress carried = p;
    p = Step(step, step < 5 ? 0.5f : 0.01f, step % 10 == 0 ? std::optional<double>(0.6) : std::nullopt);
    p.best_exact = carried.best_exact;
    p.best_step = carried.best_step;
    p.collapsed_at_step = carried.collapsed_at_step;
    if (auto w = watch.Observe(&p)) warnings.push_back(*w);
  }
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(warnings[0], "policy collapsed at step 5: entropy 0.010")) << warnings[0];
  EXPECT_TRUE(absl::StrContains(warnings[0], "90% of the last step's groups")) << warnings[0];
  EXPECT_EQ(p.collapsed_at_step, 5);
  EXPECT_FALSE(p.reached_target);
  EXPECT_DOUBLE_EQ(p.best_exact, 0.6);
  EXPECT_EQ(p.best_step, 10);
}

TEST(LearningWatch, ARunAtItsTargetIsNotCollapsedAndKnowsItsGoalStep) {
  LearningWatch watch(0.8, 0.05);
  LoopProgress p;
  for (int step = 1; step <= 20; ++step) {
    const LoopProgress carried = p;
    p = Step(step, 0.01f, step == 10 ? std::optional<double>(0.85) : std::nullopt);
    p.best_exact = carried.best_exact;
    p.best_step = carried.best_step;
    p.reached_target = carried.reached_target;
    p.goal_step = carried.goal_step;
    EXPECT_FALSE(watch.Observe(&p).has_value()) << step;
  }
  EXPECT_TRUE(p.reached_target);
  EXPECT_EQ(p.goal_step, 10);
  EXPECT_EQ(p.collapsed_at_step, 0);
}

// GetStatus tells a run that reached its target from one that ended without it.
TEST(RunManager, TheStatusSaysWhetherTheRunReachedItsTarget) {
  auto finish = [](FakeReward::Mode mode) {
    RunManager runs(
        [mode]() -> absl::StatusOr<RunPeers> {
          RunPeers peers;
          peers.rollouts.push_back(std::make_unique<FakeRollout>("a"));
          peers.reward = std::make_unique<FakeReward>(mode);
          peers.buffer = std::make_unique<FakeBuffer>();
          peers.trainer = std::make_unique<FakeTrainer>();
          return peers;
        },
        nullptr);
    v1::RunConfig c;
    c.set_total_steps(4);
    c.set_batch_size(4);
    c.set_group_size(2);
    c.set_eval_interval_steps(2);
    c.set_held_out_prompts(8);
    c.set_stop_at_exact_match(0.8f);
    c.set_seed(3);
    EXPECT_TRUE(runs.Start(c, "").ok());
    v1::StopRunResponse stopped;
    v1::GetStatusResponse status;
    for (;;) {  // (Stop waits for the end; a run that ended answers at once)
      runs.Fill(&status);
      if (status.state() == v1::RUN_STATE_COMPLETED || status.state() == v1::RUN_STATE_FAILED) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return status;
  };
  const v1::GetStatusResponse reached = finish(FakeReward::Mode::kExact);
  EXPECT_EQ(reached.state(), v1::RUN_STATE_COMPLETED);
  EXPECT_EQ(reached.goal(), v1::RUN_GOAL_REACHED);
  EXPECT_EQ(reached.goal_step(), 2u);
  EXPECT_EQ(reached.config().seed(), 3u);
  EXPECT_EQ(reached.metrics().held_out_size(), 8u);
  // Every odd item scores 0.5: half the held-out set is exact, under the target.
  const v1::GetStatusResponse missed = finish(FakeReward::Mode::kAlternate);
  EXPECT_EQ(missed.state(), v1::RUN_STATE_COMPLETED);
  EXPECT_EQ(missed.goal(), v1::RUN_GOAL_MISSED);
  EXPECT_FLOAT_EQ(missed.metrics().best_eval_exact_match(), 0.5f);
  EXPECT_EQ(missed.step(), 4u);
}

}  // namespace
}  // namespace rlfleet::controller

// The run loop against fake peers: nothing is lost when a rollout replica dies (its
// prompts go to the survivor), stop is honoured, bad config and rejected requests are
// clear errors; runs find their peers in the registry (discovery.h).
#include "services/controller/run_loop.h"

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/model/tokenizer.h"
#include "libs/registry/registry.h"
#include "libs/tasks/tasks.h"
#include "services/controller/controller_core.h"
#include "services/controller/discovery.h"
#include "services/controller/run_manager.h"
#include "services/controller/tests/fake_peers.h"

namespace rlfleet::controller {
namespace {

LoopConfig Small() {
  LoopConfig c;
  c.steps = 3;
  c.prompts = 6;
  c.samples = 2;
  c.eval_every = 1;
  c.held_out = 8;
  c.stop_at = 2.0;  // never stop early
  return c;
}

// Rollout replicas for a pool.
template <typename... Replicas>
std::vector<std::unique_ptr<RolloutReplica>> Pool(std::unique_ptr<Replicas>... replicas) {
  std::vector<std::unique_ptr<RolloutReplica>> out;
  (out.push_back(std::move(replicas)), ...);
  return out;
}

TEST(RunLoop, AReplicaThatDiesLosesNothing) {
  auto replica_a = std::make_unique<FakeRollout>("a");
  FakeRollout* a = replica_a.get();
  std::vector<std::string> logs;
  FakeRun run(Pool(std::move(replica_a), std::make_unique<FakeRollout>("b", /*fail_from_call=*/1)),
              [&](const std::string& l) { logs.push_back(l); });
  absl::Status s = run.Run(Small());
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(run.progress.size(), 3u);
  EXPECT_EQ(run.pool.live(), 1);
  ASSERT_FALSE(logs.empty());
  EXPECT_TRUE(absl::StrContains(logs[0], "rollout replica b failed")) << logs[0];
  EXPECT_TRUE(absl::StrContains(logs[0], "re-dispatching")) << logs[0];
  // Every prompt of every step reached the buffer: 3 steps x 6 prompts x 2 samples.
  EXPECT_EQ(run.buffer.experiences, 36);
  EXPECT_EQ(run.trainer.steps, 3);
  // The fakes answer right, and the held-out set was evaluated each step.
  EXPECT_EQ(run.progress.back().train_reward, 1.0);
  ASSERT_TRUE(run.progress.back().held_out_exact.has_value());
  EXPECT_EQ(*run.progress.back().held_out_exact, 1.0);
  // Replica a served everything after b died (b had one call: step 1's first share).
  EXPECT_GT(a->prompts(), 3 * 6);
  EXPECT_EQ(run.buffer.duplicates, 0);
}

// `prompts` reverse prompts ("reverse:100", ...; groups "g0", ...), 2 samples each.
v1::GenerateBatchRequest ReverseBatch(int prompts) {
  v1::GenerateBatchRequest request;
  request.set_num_samples(2);
  for (int i = 0; i < prompts; ++i) {
    v1::BatchPrompt* p = request.add_prompts();
    p->set_task("reverse");
    p->set_prompt_id(absl::StrCat("reverse:", 100 + i));
    p->set_group_id(absl::StrCat("g", i));
  }
  return request;
}

TEST(RolloutPool, EveryReplicaGetsWorkAndAFasterOneTakesMore) {
  auto fast = std::make_unique<FakeRollout>("fast");
  auto slow = std::make_unique<FakeRollout>("slow", -1, absl::OkStatus(), absl::Milliseconds(50));
  FakeRollout* f = fast.get();
  FakeRollout* s = slow.get();
  RolloutPool pool(Pool(std::move(fast), std::move(slow)), nullptr);
  v1::GenerateBatchRequest request = ReverseBatch(32);
  v1::GenerateBatchResponse response;
  ASSERT_TRUE(pool.Generate(request, &response).ok());
  // All completions, in prompt order.
  ASSERT_EQ(response.completions_size(), 64);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(response.completions(2 * i).group_id(), absl::StrCat("g", i));
  EXPECT_EQ(f->prompts() + s->prompts(), 32);
  EXPECT_GT(s->prompts(), 0);
  EXPECT_GT(f->prompts(), 2 * s->prompts()) << "fast " << f->prompts() << ", slow " << s->prompts();
}

// Gateway traffic fills a replica's queue (RESOURCE_EXHAUSTED) and a replica fails to
// decode a chunk (INTERNAL, as an out-of-memory does): neither is fatal, nothing is
// lost, no replica is dropped. A chunk that fails to decode three times fails the call.
TEST(RolloutPool, BusyAndFailedDecodesAreTriedAgainNotFatal) {
  auto busy = std::make_unique<FakeRollout>("busy");
  auto flaky = std::make_unique<FakeRollout>("flaky");
  FakeRollout* b = busy.get();
  FakeRollout* f = flaky.get();
  b->FailNext(5, absl::ResourceExhaustedError("400 sequences are queued"));
  f->FailNext(2, absl::InternalError("CUDA out of memory"));
  std::vector<std::string> logs;
  absl::Mutex logs_mu;
  RolloutPool pool(Pool(std::move(busy), std::move(flaky)), [&](const std::string& l) {
    absl::MutexLock lock(&logs_mu);
    logs.push_back(l);
  });
  v1::GenerateBatchRequest request = ReverseBatch(16);
  v1::GenerateBatchResponse response;
  ASSERT_TRUE(pool.Generate(request, &response).ok());
  ASSERT_EQ(response.completions_size(), 32);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(response.completions(2 * i).group_id(), absl::StrCat("g", i));
  EXPECT_EQ(b->prompts() + f->prompts(), 16);
  EXPECT_EQ(pool.live(), 2);
  {
    absl::MutexLock lock(&logs_mu);
    ASSERT_FALSE(logs.empty());
    EXPECT_NE(logs.back().find("found their replica busy"), std::string::npos) << logs.back();
  }
  // A chunk that fails everywhere, every time: the error, after three attempts.
  auto broken = std::make_unique<FakeRollout>("broken", /*fail_from_call=*/0, absl::InternalError("bad kernel"));
  RolloutPool one(Pool(std::move(broken)), nullptr);
  response.Clear();
  const absl::Status s = one.Generate(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(one.live(), 1);
}

// Replicas whose route installs together (the weights service's one round) get one
// call for all of them; a replica that round failed with UNAVAILABLE is dropped, the
// others serve the version.
class TogetherRollout : public FakeRollout {
 public:
  using FakeRollout::FakeRollout;
  std::vector<absl::Status> UpdateWeightsTogether(const std::vector<RolloutReplica*>& replicas,
                                                  const v1::PrepareWeightsRequest& request) override {
    ++*rounds;
    std::vector<absl::Status> out;
    for (RolloutReplica* r : replicas) {
      out.push_back(r->address() == "b" ? absl::UnavailableError("replica b: gone") : r->UpdateWeights(request));
    }
    return out;
  }
  std::shared_ptr<int> rounds = std::make_shared<int>(0);
};

TEST(RolloutPool, ReplicasOfOneRouteInstallAVersionInOneRound) {
  std::vector<std::unique_ptr<RolloutReplica>> replicas;
  std::vector<TogetherRollout*> raw;
  for (const char* a : {"a", "b", "c"}) {
    auto r = std::make_unique<TogetherRollout>(a);
    raw.push_back(r.get());
    replicas.push_back(std::move(r));
  }
  const std::shared_ptr<int> rounds = raw[0]->rounds;
  RolloutPool pool(std::move(replicas), nullptr);
  v1::PrepareWeightsRequest update;
  update.mutable_manifest()->mutable_version()->set_version(7);
  ASSERT_TRUE(pool.UpdateWeights(update).ok());
  EXPECT_EQ(*rounds, 1);  // one call for the three
  EXPECT_EQ(pool.live(), 2);
  EXPECT_EQ(pool.addresses(), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(raw[0]->version(), 7u);
  EXPECT_EQ(raw[2]->version(), 7u);
}

TEST(RunLoop, ReplicasJoinWithTheCurrentWeightsAndLeaveDrainedLosingNothing) {
  auto replica_a = std::make_unique<FakeRollout>("a");
  FakeRollout* a = replica_a.get();
  auto a_drained = a->drained_flag();  // (a is destroyed once the pool removes it)
  std::vector<std::string> logs;
  FakeRun run(Pool(std::move(replica_a), std::make_unique<FakeRollout>("b")),
              [&](const std::string& l) { logs.push_back(l); });
  // One joins before the run published weights: it waits for them.
  auto early = std::make_unique<FakeRollout>("early");
  FakeRollout* e = early.get();
  ASSERT_TRUE(run.pool.Admit(std::move(early)).ok());
  EXPECT_EQ(run.pool.live(), 2);
  FakeRollout* c = nullptr;
  std::atomic<bool> stop{false};
  LoopConfig config = Small();
  config.steps = 4;
  absl::Status s = RunLoop(config, run.pool, run.reward, run.buffer, run.trainer, stop, [&](const LoopProgress& p) {
    run.progress.push_back(p);
    if (p.step == 1) {  // scale up: c joins with the weights the run installed last
      auto joining = std::make_unique<FakeRollout>("c");
      c = joining.get();
      EXPECT_TRUE(run.pool.Admit(std::move(joining)).ok());
      EXPECT_GT(c->version(), 0u) << "admitted before it had the current weights";
      EXPECT_EQ(run.pool.Admit(std::make_unique<FakeRollout>("c")).code(), absl::StatusCode::kAlreadyExists);
    }
    if (p.step == 2) {
      EXPECT_TRUE(run.pool.Remove("a").ok());  // scale down: a drains and leaves
    }
  });
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_NE(c, nullptr);
  EXPECT_GT(c->prompts(), 0) << "the new replica got no work";
  EXPECT_GT(e->prompts(), 0) << "the early replica never joined";
  EXPECT_TRUE(*a_drained);
  EXPECT_EQ(run.pool.Remove("a").code(), absl::StatusCode::kNotFound);
  const std::vector<std::string> left = run.pool.addresses();
  EXPECT_EQ(std::set<std::string>(left.begin(), left.end()), (std::set<std::string>{"b", "c", "early"}));
  // Nothing lost: every prompt of every step reached the buffer once.
  EXPECT_EQ(run.buffer.experiences, 4 * 6 * 2);
  EXPECT_EQ(run.progress.back().train_reward, 1.0);
}

TEST(RunLoop, AsyncModeOverlapsAndLosesNothing) {
  FakeRun run(Pool(std::make_unique<FakeRollout>("a"), std::make_unique<FakeRollout>("b")));
  LoopConfig c = Small();
  c.steps = 5;
  c.max_staleness = 1;
  absl::Status s = run.Run(c);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(run.progress.size(), 5u);
  EXPECT_EQ(run.buffer.experiences, 5 * 6 * 2);  // every step's rollouts, none generated twice
  EXPECT_EQ(run.trainer.steps, 5);
  EXPECT_EQ(run.trainer.last_max_staleness, 1u);
  EXPECT_EQ(run.progress.back().train_reward, 1.0);
}

// A fully asynchronous run over two replicas (one dying after its third call) with a
// trainer linked to the buffer: every step trains on groups that are in the buffer,
// nothing is lost or generated twice, and no group was generated by a policy more than
// max_staleness steps behind the step it belongs to.
TEST(RunLoop, FullyAsyncStreamsEveryGroupWithinTheStalenessBound) {
  std::vector<std::string> logs;
  RolloutPool pool(Pool(std::make_unique<FakeRollout>("a"), std::make_unique<FakeRollout>("b", /*fail_from_call=*/3)),
                   [&](const std::string& l) { logs.push_back(l); });
  FakeReward reward(FakeReward::Mode::kAlternate);  // every group has a learning signal
  FakeBuffer buffer;
  FakeTrainer trainer(&buffer);
  trainer.limit_to_num_groups = true;
  LoopConfig c = Small();
  c.steps = 6;
  c.prompts = 8;
  c.samples = 4;
  c.eval_every = 3;
  c.max_staleness = 1;
  c.fully_async = true;
  std::vector<LoopProgress> progress;
  std::atomic<bool> stop{false};
  absl::Status s =
      RunLoop(c, pool, reward, buffer, trainer, stop, [&](const LoopProgress& p) { progress.push_back(p); });
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(progress.size(), 6u);
  EXPECT_EQ(buffer.experiences, 6 * 8 * 4);  // every group once
  EXPECT_EQ(buffer.duplicates, 0);
  EXPECT_EQ(trainer.steps, 6);
  EXPECT_EQ(progress.back().idle_steps, 0);
  EXPECT_EQ(progress.back().trained_sequences, 6u * 8 * 4);
  EXPECT_EQ(trainer.publishes, 7);  // the run's start, then one per step
  ASSERT_TRUE(progress[2].held_out_exact.has_value());
  EXPECT_EQ(*progress[2].held_out_exact, 0.5);  // (kAlternate: every odd item scores 0.5)
  EXPECT_EQ(pool.live(), 1);
  ASSERT_FALSE(logs.empty());
  EXPECT_TRUE(absl::StrContains(logs[0], "rollout replica b failed")) << logs[0];
  // Group ids are <tag>-g<first group of the call>-g<i>: the step is first / prompts + 1.
  // Version 1 + k is installed once k steps trained; step s's groups may be generated
  // once step s - 1 - max_staleness finished.
  uint64_t newest = 0;
  for (const v1::Experience& e : buffer.stored) {
    const std::string& g = e.group_id();
    const std::string call = g.substr(0, g.rfind("-g"));
    const size_t at = call.rfind("-g");
    ASSERT_NE(at, std::string::npos) << g;
    const int first = std::stoi(call.substr(at + 2));
    const int step = first / 8 + 1;
    ASSERT_GT(e.token_policy_versions_size(), 0);
    EXPECT_GE(e.token_policy_versions(0), static_cast<uint64_t>(std::max(1, step - c.max_staleness)))
        << g << " (step " << step << ")";
    newest = std::max<uint64_t>(newest, e.token_policy_versions(0));
  }
  EXPECT_GE(newest, 5u);  // later steps ran on newer versions
}

TEST(RunLoop, FullyAsyncNeedsStalenessAndFailsARunWithNothingToLearn) {
  {
    FakeRun run(Pool(std::make_unique<FakeRollout>("a")));
    LoopConfig c = Small();
    c.fully_async = true;
    absl::Status s = run.Run(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(s.message(), "fully_async")) << s;
  }
  RolloutPool pool(Pool(std::make_unique<FakeRollout>("a")), nullptr);
  FakeReward reward(FakeReward::Mode::kConstant);
  FakeBuffer buffer;
  FakeTrainer trainer(&buffer);
  LoopConfig c = Small();
  c.eval_every = 0;
  c.max_staleness = 2;
  c.fully_async = true;
  std::atomic<bool> stop{false};
  absl::Status s = RunLoop(c, pool, reward, buffer, trainer, stop, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "idle")) << s;
  EXPECT_EQ(trainer.steps, 0);
  EXPECT_EQ(buffer.experiences, 3 * 6 * 2);
}

// A replica whose GenerateBatch waits until it is let go.
class HeldRollout : public FakeRollout {
 public:
  using FakeRollout::FakeRollout;
  absl::Status GenerateBatch(const v1::GenerateBatchRequest& request, v1::GenerateBatchResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      ++waiting_;
      mu_.Await(absl::Condition(&released_));
    }
    return FakeRollout::GenerateBatch(request, response);
  }
  void AwaitCall() {
    absl::MutexLock lock(&mu_);
    auto called = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_ > 0; };
    mu_.Await(absl::Condition(&called));
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }

 private:
  absl::Mutex mu_;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// A weight update and a scaling change go on while a replica is generating (it swaps
// versions at a decode-step boundary); the generation then finishes with every prompt.
TEST(RolloutPool, UpdatesAndScalingDoNotWaitForGenerationInFlight) {
  auto held = std::make_unique<HeldRollout>("a");
  HeldRollout* a = held.get();
  RolloutPool pool(Pool(std::move(held)), nullptr);
  v1::GenerateBatchRequest request;
  request.set_request_id("r");
  request.set_num_samples(2);
  for (int i = 0; i < 4; ++i) {
    v1::BatchPrompt* p = request.add_prompts();
    p->set_prompt_id(absl::StrCat("reverse:12", i));
    p->set_group_id(absl::StrCat("g", i));
    p->set_task("reverse");
    p->add_prompt_token_ids(1);
  }
  v1::GenerateBatchResponse response;
  absl::Status generated;
  std::thread generation([&] { generated = pool.Generate(request, &response); });
  a->AwaitCall();
  v1::PrepareWeightsRequest update;
  update.mutable_manifest()->mutable_version()->set_version(7);
  EXPECT_TRUE(pool.UpdateWeights(update).ok());  // returns while the call is held
  EXPECT_EQ(a->version(), 7u);
  EXPECT_TRUE(pool.Admit(std::make_unique<FakeRollout>("b")).ok());
  EXPECT_EQ(pool.live(), 2);
  a->Release();
  generation.join();
  ASSERT_TRUE(generated.ok()) << generated;
  EXPECT_EQ(response.completions_size(), 8);
}

TEST(RunLoop, StopsWhenAskedAndWhenNoReplicaIsLeft) {
  {
    FakeRun run(Pool(std::make_unique<FakeRollout>("a")));
    ASSERT_TRUE(run.Run(Small(), /*stopped=*/true).ok());
    EXPECT_EQ(run.progress.size(), 0u);
  }
  FakeRun run(Pool(std::make_unique<FakeRollout>("a", 0)));
  LoopConfig config = Small();
  config.unavailable_retry = absl::Milliseconds(300);  // (no replica joins within it)
  absl::Status s = run.Run(config);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "step 1")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "no rollout replica left")) << s;
}

// Every replica gone (killed together): the run waits for one to join (the launcher's
// replacement) within unavailable_retry instead of failing, and loses nothing.
TEST(RunLoop, ARunWithNoReplicaLeftWaitsForOneToJoin) {
  FakeRun run(Pool(std::make_unique<FakeRollout>("a", 2)));
  std::atomic<bool> joined{false};
  std::thread joiner([&] {
    absl::SleepFor(absl::Milliseconds(300));  // (a replacement that starts a while later)
    joined = run.pool.Admit(std::make_unique<FakeRollout>("b")).ok();
  });
  absl::Status s = run.Run(Small());
  joiner.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(joined.load());
  ASSERT_EQ(run.progress.size(), 3u);
  EXPECT_EQ(run.buffer.experiences, 3 * 6 * 2);
  EXPECT_EQ(run.pool.addresses(), std::vector<std::string>{"b"});
}

TEST(RunLoop, BadConfigAndRejectedRequestsAreClearErrors) {
  LoopConfig bad = Small();
  bad.samples = 1;
  EXPECT_TRUE(absl::StrContains(ValidateLoopConfig(bad).message(), "samples")) << ValidateLoopConfig(bad);
  bad = Small();
  bad.task = "juggle";
  EXPECT_EQ(ValidateLoopConfig(bad).code(), absl::StatusCode::kInvalidArgument);

  // A replica that rejects the request is not dropped: the error is the run's.
  FakeRun run(Pool(std::make_unique<FakeRollout>("a", 0, absl::InvalidArgumentError("prompt too long")),
                   std::make_unique<FakeRollout>("b")));
  absl::Status s = run.Run(Small());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "prompt too long")) << s;
  EXPECT_EQ(run.pool.live(), 2);
}

// Issue 18: a second run on the same fleet trained nothing. The buffer remembers every
// experience id it has seen, and the loop's request ids (so the replicas' experience
// ids) were the same in every run: the second run's experiences were all duplicates,
// every step was idle, and the run still completed.
TEST(RunLoop, ASecondRunOnTheSameBufferAndTrainerTrains) {
  FakeBuffer buffer;
  FakeTrainer trainer(&buffer);
  FakeReward reward(FakeReward::Mode::kAlternate);
  std::atomic<bool> stop{false};
  uint64_t first_version = 0;
  for (int run = 0; run < 2; ++run) {
    RolloutPool pool(Pool(std::make_unique<FakeRollout>("a")), nullptr);
    std::vector<LoopProgress> progress;
    absl::Status s =
        RunLoop(Small(), pool, reward, buffer, trainer, stop, [&](const LoopProgress& p) { progress.push_back(p); });
    ASSERT_TRUE(s.ok()) << "run " << run << ": " << s;
    ASSERT_EQ(progress.size(), 3u);
    EXPECT_EQ(progress.back().idle_steps, 0) << "run " << run;
    EXPECT_EQ(buffer.duplicates, 0) << "run " << run;
    if (run == 0) first_version = progress.back().policy_version;
    if (run == 1) {
      EXPECT_GT(progress.back().policy_version, first_version);
    }
  }
  EXPECT_EQ(trainer.steps, 6);
}

TEST(RunLoop, ABufferThatTakesNoneOfAStepsExperiencesFailsTheRun) {
  FakeRun run(Pool(std::make_unique<FakeRollout>("a")));
  // A buffer that has seen every id (as the first run's ids were, to the second).
  class Seen : public FakeBuffer {
   public:
    absl::Status PutExperiences(const v1::PutExperiencesRequest& request,
                                v1::PutExperiencesResponse* response) override {
      response->set_duplicates(request.experiences_size());
      return absl::OkStatus();
    }
  } seen;
  RolloutPool pool(Pool(std::make_unique<FakeRollout>("b")), nullptr);
  std::atomic<bool> stop{false};
  absl::Status s = RunLoop(Small(), pool, run.reward, seen, run.trainer, stop, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "step 1")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "accepted none")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "duplicates")) << s;
}

TEST(RunLoop, ARunWhoseEveryStepIsIdleFailsSayingWhy) {
  FakeBuffer buffer;
  FakeTrainer trainer(&buffer);
  FakeReward reward(FakeReward::Mode::kConstant);  // no group ever varies
  RolloutPool pool(Pool(std::make_unique<FakeRollout>("a")), nullptr);
  std::atomic<bool> stop{false};
  std::vector<LoopProgress> progress;
  absl::Status s =
      RunLoop(Small(), pool, reward, buffer, trainer, stop, [&](const LoopProgress& p) { progress.push_back(p); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "every one of the 3 steps was idle")) << s;
  ASSERT_EQ(progress.size(), 3u);
  EXPECT_EQ(progress.back().idle_steps, 3);
  EXPECT_EQ(trainer.steps, 0);
  // Idle steps among trained ones are fine (UNAVAILABLE without a signal is not retried).
  EXPECT_EQ(trainer.calls, 3);
}

TEST(RunLoop, TrainerUnavailableWithALearningSignalIsRetriedThenFails) {
  {
    FakeBuffer buffer;
    FakeTrainer trainer(&buffer);
    trainer.unavailable = 2;  // restarting: two refusals, then it answers
    FakeReward reward(FakeReward::Mode::kAlternate);
    RolloutPool pool(Pool(std::make_unique<FakeRollout>("a")), nullptr);
    std::atomic<bool> stop{false};
    std::vector<LoopProgress> progress;
    LoopConfig c = Small();
    c.unavailable_retry = absl::Seconds(30);
    absl::Status s =
        RunLoop(c, pool, reward, buffer, trainer, stop, [&](const LoopProgress& p) { progress.push_back(p); });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(trainer.steps, 3);
    EXPECT_EQ(progress.back().idle_steps, 0);  // not "nothing to learn"
  }
  FakeBuffer buffer;
  FakeTrainer trainer(&buffer);
  trainer.unavailable = 1 << 30;  // gone for good
  FakeReward reward(FakeReward::Mode::kAlternate);
  RolloutPool pool(Pool(std::make_unique<FakeRollout>("a")), nullptr);
  std::atomic<bool> stop{false};
  LoopConfig c = Small();
  c.unavailable_retry = absl::Milliseconds(300);
  absl::Status s = RunLoop(c, pool, reward, buffer, trainer, stop, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "step 1")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "learning signal")) << s;
  EXPECT_GT(trainer.calls, 1);
}

// A trainer killed after it consumed its batch (acked the lease) and before its reply
// arrived: the retries find no group, ever. The step publishes the trainer's weights
// instead of retrying until the run fails (Chaos.TheTrainerKilledMidRun... once hit it).
TEST(RunLoop, ABatchConsumedByAnAttemptWhoseReplyWasLostEndsTheStep) {
  FakeBuffer buffer;
  FakeTrainer trainer(&buffer);
  trainer.lose_replies = 1;
  FakeReward reward(FakeReward::Mode::kAlternate);
  RolloutPool pool(Pool(std::make_unique<FakeRollout>("a")), nullptr);
  std::atomic<bool> stop{false};
  std::vector<LoopProgress> progress;
  LoopConfig c = Small();
  c.unavailable_retry = absl::Seconds(60);  // (what the run would wait for before failing)
  const absl::Time begin = absl::Now();
  absl::Status s =
      RunLoop(c, pool, reward, buffer, trainer, stop, [&](const LoopProgress& p) { progress.push_back(p); });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_LT(absl::Now() - begin, absl::Seconds(30)) << "the step waited out its retries";
  ASSERT_EQ(progress.size(), 3u);
  EXPECT_EQ(trainer.calls, 3);                       // no retry of the consumed step
  EXPECT_EQ(trainer.publishes, 4);                   // the start, and after every step: the consumed one too
  EXPECT_EQ(progress.back().trained_sequences, 2u);  // the lost reply's sequences are not counted
  EXPECT_EQ(progress.back().idle_steps, 0);
}

// A replica's FAILED_PRECONDITION to UpdateWeights is "installed" only when it serves
// exactly that version; one that serves another cannot serve this run and is dropped.
// A replica that answers its first install NOT_FOUND (the version was retired while it
// joined: the weights service keeps a few) after `meanwhile` ran.
class RetiredOnceRollout : public FakeRollout {
 public:
  RetiredOnceRollout(std::string address, std::function<void()> meanwhile)
      : FakeRollout(std::move(address)), meanwhile_(std::move(meanwhile)) {}
  absl::Status UpdateWeights(const v1::PrepareWeightsRequest& request) override {
    if (meanwhile_) {
      auto run = std::move(meanwhile_);
      meanwhile_ = nullptr;
      run();
      return absl::NotFoundError(absl::StrCat("version ", request.manifest().version().version(), " is not published"));
    }
    return FakeRollout::UpdateWeights(request);
  }

 private:
  std::function<void()> meanwhile_;
};

// A joiner whose version was retired while it joined catches up with the run's newer
// version and is admitted with it; one whose version is simply absent is refused.
TEST(RolloutPool, AJoinerWhoseVersionWasRetiredCatchesUpWithTheNewerOne) {
  std::vector<std::string> logs;
  RolloutPool pool(Pool(std::make_unique<FakeRollout>("a")), [&](const std::string& l) { logs.push_back(l); });
  v1::PrepareWeightsRequest v5, v6;
  v5.mutable_manifest()->mutable_version()->set_version(5);
  v6.mutable_manifest()->mutable_version()->set_version(6);
  ASSERT_TRUE(pool.UpdateWeights(v5).ok());
  auto joining = std::make_unique<RetiredOnceRollout>("b", [&] { EXPECT_TRUE(pool.UpdateWeights(v6).ok()); });
  RetiredOnceRollout* b = joining.get();
  const absl::Status joined = pool.Admit(std::move(joining));
  ASSERT_TRUE(joined.ok()) << joined;
  EXPECT_EQ(b->version(), 6u);
  EXPECT_EQ(pool.addresses(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(absl::StrContains(logs.back(), "admitted with version 6")) << logs.back();
  // Retired with nothing newer to take: refused, naming the version.
  auto lost = std::make_unique<RetiredOnceRollout>("c", [] {});
  const absl::Status refused = pool.Admit(std::move(lost));
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "installing version 6 on joining replica c")) << refused;
}

TEST(RolloutPool, AReplicaRefusingAVersionCountsAsInstalledOnlyIfItServesIt) {
  auto same = std::make_unique<FakeRollout>("same");
  auto newer = std::make_unique<FakeRollout>("newer");
  auto busy = std::make_unique<FakeRollout>("busy");
  same->SetVersion(5);   // has it already: FAILED_PRECONDITION, and serves 5
  newer->SetVersion(9);  // from another run: FAILED_PRECONDITION, serves 9
  busy->FailUpdates(absl::FailedPreconditionError("version 4 is being installed; retry after it"));
  std::vector<std::string> logs;
  RolloutPool pool(Pool(std::move(same), std::move(newer), std::move(busy)),
                   [&](const std::string& l) { logs.push_back(l); });
  v1::PrepareWeightsRequest update;
  update.mutable_manifest()->mutable_version()->set_version(5);
  ASSERT_TRUE(pool.UpdateWeights(update).ok());
  EXPECT_EQ(pool.addresses(), (std::vector<std::string>{"same"}));
  ASSERT_EQ(logs.size(), 2u);
  EXPECT_TRUE(absl::StrContains(logs[0], "serves version 9")) << logs[0];
  EXPECT_TRUE(absl::StrContains(logs[1], "being installed")) << logs[1];
  // Joining works the same way.
  auto stale = std::make_unique<FakeRollout>("stale");
  stale->SetVersion(7);
  absl::Status joined = pool.Admit(std::move(stale));
  EXPECT_EQ(joined.code(), absl::StatusCode::kFailedPrecondition) << joined;
  EXPECT_TRUE(absl::StrContains(joined.message(), "serves version 7")) << joined;
  auto current = std::make_unique<FakeRollout>("current");
  current->SetVersion(5);
  EXPECT_TRUE(pool.Admit(std::move(current)).ok());
  // None left that serves the run's version: the error says why.
  auto only = std::make_unique<FakeRollout>("only");
  only->SetVersion(50);
  RolloutPool none(Pool(std::move(only)), nullptr);
  absl::Status s = none.UpdateWeights(update);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "serves version 50")) << s;
}

TEST(RunLoop, RunFieldsReachThePeers) {
  FakeRun run(Pool(std::make_unique<FakeRollout>("a")));
  LoopConfig c = Small();
  c.run_id = "run-fields";
  c.clip_ratio = 0.3;
  c.clip_ratio_high = 0.4;
  c.checkpoint_dir = "ckpt";
  c.checkpoint_every = 2;
  ASSERT_TRUE(run.Run(c).ok());
  EXPECT_FLOAT_EQ(run.trainer.last_params.clip_ratio(), 0.3f);
  EXPECT_FLOAT_EQ(run.trainer.last_params.clip_ratio_high(), 0.4f);
  ASSERT_EQ(run.buffer.configured.size(), 1u);
  EXPECT_EQ(run.buffer.configured[0].run_id(), "run-fields");
  // Every 2 steps, and at the end (step 3).
  EXPECT_EQ(run.trainer.checkpoints, (std::vector<std::string>{"ckpt/run-fields-step-2", "ckpt/run-fields-step-3"}));
  EXPECT_EQ(run.progress.back().last_checkpoint, "ckpt/run-fields-step-3");
  // The folder was checked (a dry run) before the first step.
  EXPECT_EQ(run.trainer.checked_checkpoints, (std::vector<std::string>{"ckpt/run-fields-step-0"}));
  // A folder the trainer cannot write fails the run before any step trains (it used to
  // fail at the first checkpoint, steps later).
  FakeRun failing(Pool(std::make_unique<FakeRollout>("a")));
  failing.trainer.checkpoint_failure = absl::PermissionDeniedError("read-only file system");
  absl::Status s = failing.Run(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "checkpoint_dir ckpt: the trainer cannot save checkpoints there")) << s;
  EXPECT_EQ(failing.trainer.steps, 0);
  EXPECT_TRUE(failing.progress.empty());
}

TEST(RunLoop, ATaskWithAToolRunsMultiTurnEpisodesAndStoresWholeTrajectories) {
  FakeRun run(Pool(std::make_unique<FakeRollout>("a")));
  LoopConfig c = Small();
  c.task = "mul";
  c.min_len = 2;
  c.max_len = 2;
  ASSERT_TRUE(run.Run(c).ok());
  // The greedy held-out episodes call the calculator and answer from its result.
  ASSERT_FALSE(run.progress.empty());
  EXPECT_EQ(run.progress.back().held_out_exact, 1.0);
  ASSERT_FALSE(run.buffer.stored.empty());
  for (const v1::Experience& e : run.buffer.stored) {
    const std::string text =
        model::Tokenizer::DecodeResponse({e.response_token_ids().begin(), e.response_token_ids().end()});
    EXPECT_EQ(text, *tasks::FindTask("mul")->Demonstration(e.prompt_id())) << e.prompt_id();
    ASSERT_EQ(e.response_loss_mask_size(), e.response_token_ids_size());
    // The tool's "(product)" is out of the loss, the rest in.
    const size_t open = text.find('('), close = text.find(')');
    for (int i = 0; i < e.response_loss_mask_size(); ++i) {
      EXPECT_EQ(e.response_loss_mask(i), i < static_cast<int>(open) || i > static_cast<int>(close)) << text << " " << i;
    }
  }
}

TEST(RunManager, RunConfigErrorsNameTheField) {
  v1::RunConfig c;
  c.set_max_staleness(500);
  EXPECT_TRUE(absl::StrContains(LoopConfigFromRun(c).status().message(), "max_staleness"));
  c.Clear();
  (*c.mutable_task_params())["max_len"] = "five";
  EXPECT_TRUE(absl::StrContains(LoopConfigFromRun(c).status().message(), "task_params[max_len]"));
  c.Clear();
  c.set_group_size(1);
  EXPECT_EQ(LoopConfigFromRun(c).status().code(), absl::StatusCode::kInvalidArgument);
  c.Clear();
  c.set_total_steps(7);
  c.set_batch_size(3);
  auto loop = LoopConfigFromRun(c);
  ASSERT_TRUE(loop.ok()) << loop.status();
  EXPECT_EQ(loop->steps, 7);
  EXPECT_EQ(loop->prompts, 3);
}

// Concurrent StartRun calls (a retried CLI, two operators): exactly one run starts,
// the others are refused FAILED_PRECONDITION, even when making peers takes a while.
TEST(RunManager, ConcurrentStartsStartOneRun) {
  std::atomic<int> factories{0};
  RunManager runs(
      [&]() -> absl::StatusOr<RunPeers> {
        ++factories;
        absl::SleepFor(absl::Milliseconds(50));  // (a slow registry lookup widens the window)
        return OneReplicaFakePeers();
      },
      nullptr);
  v1::RunConfig c;
  c.set_total_steps(0);  // until stopped
  c.set_batch_size(2);
  c.set_group_size(2);
  std::vector<absl::StatusOr<std::string>> results(6, absl::UnknownError("not run"));
  std::vector<std::thread> callers;
  for (size_t i = 0; i < results.size(); ++i) {
    callers.emplace_back([&, i] { results[i] = runs.Start(c, ""); });
  }
  for (auto& t : callers) t.join();
  int started = 0;
  for (const auto& r : results) {
    if (r.ok()) {
      ++started;
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    }
  }
  EXPECT_EQ(started, 1);
  EXPECT_EQ(factories.load(), 1);  // (the others were refused before making peers)
  v1::StopRunResponse stopped;
  ASSERT_TRUE(runs.Stop("", false, absl::Seconds(30), &stopped).ok());
}

TEST(RunManager, StartRunsAndStopStops) {
  RunManager runs(OneReplicaFakePeers, nullptr);
  v1::RunConfig c;
  c.set_total_steps(0);  // until stopped
  c.set_batch_size(2);
  c.set_group_size(2);
  c.set_eval_interval_steps(1);
  auto id = runs.Start(c, "");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(runs.Start(c, "").status().code(), absl::StatusCode::kFailedPrecondition);
  v1::StopRunResponse stopped;
  ASSERT_TRUE(runs.Stop("", false, absl::Seconds(30), &stopped).ok());
  EXPECT_EQ(stopped.state(), v1::RUN_STATE_STOPPED);
  v1::GetStatusResponse status;
  runs.Fill(&status);
  EXPECT_EQ(status.run_id(), *id);
  EXPECT_EQ(status.state(), v1::RUN_STATE_STOPPED);
  EXPECT_EQ(runs.Stop("other", false, absl::Seconds(1), &stopped).code(), absl::StatusCode::kNotFound);
  // A finished run makes room for the next.
  c.set_total_steps(2);
  ASSERT_TRUE(runs.Start(c, "second").ok());
}

// A controller's registry (in memory) with replicas registered through its core.
struct Registry {
  Registry()
      : registry(*registry::OpenRegistry("memory://", common::Clock::Real())),
        core(registry.get(), common::Clock::Real()) {
    core.StartWatching(absl::Milliseconds(10));
  }
  // Registers `address` as `role` with `load` in-flight requests; returns the lease.
  std::string Add(v1::ReplicaRole role, const std::string& address, uint32_t load = 0) {
    v1::RegisterRequest request;
    request.mutable_replica()->set_replica_id(absl::StrCat("r-", ++ids));
    request.mutable_replica()->set_role(role);
    request.mutable_replica()->set_grpc_address(address);
    request.mutable_replica()->mutable_load()->set_inflight_requests(load);
    v1::RegisterResponse response;
    EXPECT_TRUE(core.Register(request, &response).ok());
    leases[address] = {request.replica().replica_id(), response.lease_id()};
    return response.lease_id();
  }
  void Remove(const std::string& address) {
    v1::DeregisterRequest request;
    request.set_replica_id(leases[address].first);
    request.set_lease_id(leases[address].second);
    v1::DeregisterResponse response;
    EXPECT_TRUE(core.Deregister(request, &response).ok());
  }
  std::unique_ptr<registry::Registry> registry;
  ControllerCore core;
  int ids = 0;
  std::map<std::string, std::pair<std::string, std::string>> leases;  // address -> (id, lease)
};

// Waits up to 10 s for `condition`.
bool Eventually(const std::function<bool()>& condition) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST(Discovery, PeersComeFromTheFlagElseTheLeastLoadedRegisteredReplica) {
  Registry r;
  auto none = ResolvePeerAddress(r.core, v1::REPLICA_ROLE_REWARD, "", "reward");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "--reward")) << none.status();
  r.Add(v1::REPLICA_ROLE_REWARD, "busy:1", /*load=*/5);
  r.Add(v1::REPLICA_ROLE_REWARD, "idle:2", /*load=*/1);
  r.Add(v1::REPLICA_ROLE_BUFFER, "buffer:3");
  EXPECT_EQ(*ResolvePeerAddress(r.core, v1::REPLICA_ROLE_REWARD, "", "reward"), "idle:2");
  EXPECT_EQ(*ResolvePeerAddress(r.core, v1::REPLICA_ROLE_REWARD, "flag:9", "reward"), "flag:9");
  EXPECT_EQ(*ResolvePeerAddress(r.core, v1::REPLICA_ROLE_BUFFER, "", "buffer"), "buffer:3");
  EXPECT_FALSE(ResolvePeerAddress(r.core, v1::REPLICA_ROLE_TRAINER, "", "trainer").ok());
  r.Add(v1::REPLICA_ROLE_ROLLOUT, "rollout:5");
  r.Add(v1::REPLICA_ROLE_ROLLOUT, "rollout:4");
  EXPECT_EQ(RolloutAddressesForRun(r.core, "rollout:4,flag:7"),
            (std::vector<std::string>{"flag:7", "rollout:4", "rollout:5"}));
}

TEST(Discovery, RegisteredRolloutReplicasJoinTheActiveRunAndDeregisteredOnesLeaveDrained) {
  Registry r;
  auto factory = [&r]() -> absl::StatusOr<RunPeers> {
    RunPeers peers;
    for (const std::string& a : RolloutAddressesForRun(r.core, "a")) {
      peers.rollouts.push_back(std::make_unique<FakeRollout>(a));
    }
    peers.reward = std::make_unique<FakeReward>();
    peers.buffer = std::make_unique<FakeBuffer>();
    peers.trainer = std::make_unique<FakeTrainer>();
    return peers;
  };
  RunManager runs(factory, nullptr);
  absl::Mutex mu;
  std::map<std::string, FakeRollout*> made;  // what discovery made, by address
  std::vector<std::string> logs;
  auto discovery = RolloutDiscovery::Start(
      &r.core, &runs,
      [&](const std::string& address) -> absl::StatusOr<std::unique_ptr<RolloutReplica>> {
        auto replica = std::make_unique<FakeRollout>(address);
        absl::MutexLock lock(&mu);
        made[address] = replica.get();
        return replica;
      },
      [&](const std::string& line) {
        absl::MutexLock lock(&mu);
        logs.push_back(line);
      });
  ASSERT_TRUE(discovery.ok()) << discovery.status();
  // Registered before the run: in it from the start (the run lists the registry).
  r.Add(v1::REPLICA_ROLE_ROLLOUT, "early:1");
  v1::RunConfig c;
  c.set_total_steps(0);  // until stopped
  c.set_batch_size(2);
  c.set_group_size(2);
  c.set_eval_interval_steps(1);
  ASSERT_TRUE(runs.Start(c, "").ok());
  auto has = [&](const std::string& a) { return InRun(runs, a); };
  ASSERT_TRUE(Eventually([&] { return has("a") && has("early:1"); }));
  // Registered during the run: joins it with the run's weights.
  r.Add(v1::REPLICA_ROLE_ROLLOUT, "late:2");
  ASSERT_TRUE(Eventually([&] { return has("late:2"); }));
  FakeRollout* late = nullptr;
  {
    absl::MutexLock lock(&mu);
    late = made["late:2"];
  }
  ASSERT_NE(late, nullptr);
  auto late_drained = late->drained_flag();  // (late is destroyed once the run removes it)
  // Admitted with the current weights (the run has published at least version 1),
  // then given prompts.
  ASSERT_TRUE(Eventually([&] { return late->prompts() > 0; }));
  EXPECT_GT(late->version(), 0u);
  // Deregistered: leaves the run drained.
  r.Remove("late:2");
  ASSERT_TRUE(Eventually([&] { return !has("late:2"); }));
  EXPECT_TRUE(*late_drained);
  EXPECT_TRUE(has("early:1"));
  v1::StopRunResponse stopped;
  ASSERT_TRUE(runs.Stop("", false, absl::Seconds(30), &stopped).ok());
  discovery->reset();
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(logs.empty()) << logs.front();
}

// A replica the run dropped (it failed, or hung past the call deadline) but that stays
// registered (it came back before its lease ran out: no new ADDED event) is offered to
// the run again by discovery's reconciliation, and rejoins.
TEST(Discovery, ARegisteredReplicaTheRunDroppedRejoins) {
  Registry r;
  r.Add(v1::REPLICA_ROLE_ROLLOUT, "flaky:1");
  auto factory = [&]() -> absl::StatusOr<RunPeers> {
    RunPeers peers;
    peers.rollouts.push_back(std::make_unique<FakeRollout>("a"));
    peers.rollouts.push_back(std::make_unique<FakeRollout>("flaky:1", 0, absl::DeadlineExceededError("hung")));
    peers.reward = std::make_unique<FakeReward>();
    peers.buffer = std::make_unique<FakeBuffer>();
    peers.trainer = std::make_unique<FakeTrainer>();
    return peers;
  };
  RunManager runs(factory, nullptr);
  absl::Mutex mu;
  std::vector<std::string> logs;
  auto discovery = RolloutDiscovery::Start(
      &r.core, &runs,
      [](const std::string& address) -> absl::StatusOr<std::unique_ptr<RolloutReplica>> {
        return std::make_unique<FakeRollout>(address);  // (answering again)
      },
      [&](const std::string& line) {
        absl::MutexLock lock(&mu);
        logs.push_back(line);
      },
      /*reconcile_every=*/absl::Milliseconds(50), /*retry_after=*/absl::Milliseconds(100));
  ASSERT_TRUE(discovery.ok()) << discovery.status();
  v1::RunConfig c;
  c.set_total_steps(0);
  c.set_batch_size(2);
  c.set_group_size(2);
  ASSERT_TRUE(runs.Start(c, "").ok());
  auto has = [&](const std::string& a) { return InRun(runs, a); };
  // Dropped at its first call, then offered again and admitted.
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return std::any_of(logs.begin(), logs.end(), [](const std::string& l) {
      return absl::StrContains(l, "flaky:1 was not in the run: admitted");
    });
  }));
  EXPECT_TRUE(has("flaky:1"));
  EXPECT_TRUE(has("a"));
  v1::StopRunResponse stopped;
  ASSERT_TRUE(runs.Stop("", false, absl::Seconds(30), &stopped).ok());
  discovery->reset();
}

// A replica that registers mid-run but serves another version (FAILED_PRECONDITION to
// the run's) is not taken for "no active run" and dropped silently: the refusal is
// logged and it is not in the pool.
TEST(Discovery, AJoiningReplicaThatServesAnotherVersionIsRefusedAndLogged) {
  Registry r;
  RunManager runs(OneReplicaFakePeers, nullptr);
  absl::Mutex mu;
  std::vector<std::string> logs;
  auto discovery = RolloutDiscovery::Start(
      &r.core, &runs,
      [](const std::string& address) -> absl::StatusOr<std::unique_ptr<RolloutReplica>> {
        auto replica = std::make_unique<FakeRollout>(address);
        replica->SetVersion(1000);  // another fleet's run
        return replica;
      },
      [&](const std::string& line) {
        absl::MutexLock lock(&mu);
        logs.push_back(line);
      });
  ASSERT_TRUE(discovery.ok()) << discovery.status();
  v1::RunConfig c;
  c.set_total_steps(0);
  c.set_batch_size(2);
  c.set_group_size(2);
  ASSERT_TRUE(runs.Start(c, "").ok());
  // After its first step the run has installed weights: a joiner is checked at once.
  ASSERT_TRUE(Eventually([&] {
    v1::GetStatusResponse status;
    runs.Fill(&status);
    return status.step() >= 1;
  }));
  r.Add(v1::REPLICA_ROLE_ROLLOUT, "other:9");
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return !logs.empty();
  }));
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(absl::StrContains(logs[0], "other:9")) << logs[0];
    EXPECT_TRUE(absl::StrContains(logs[0], "serves version 1000")) << logs[0];
  }
  EXPECT_EQ(runs.RolloutAddresses(), (std::vector<std::string>{"a"}));
  v1::StopRunResponse stopped;
  ASSERT_TRUE(runs.Stop("", false, absl::Seconds(30), &stopped).ok());
  discovery->reset();
}

}  // namespace
}  // namespace rlfleet::controller

// The run loop against fake peers: nothing is lost when a rollout replica dies (its
// prompts go to the survivor), stop is honoured, bad config and rejected requests are
// clear errors; runs find their peers in the registry (discovery.h).
#include "services/controller/run_loop.h"
#include "services/controller/run_manager.h"

#include <atomic>
#include <map>

#include <set>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/model/tokenizer.h"
#include "libs/registry/registry.h"
#include "libs/tasks/tasks.h"
#include "services/controller/controller_core.h"
#include "services/controller/discovery.h"

namespace rlfleet::controller {
namespace {

// Answers every prompt correctly; can be made to fail from its n-th call on.
class FakeRollout : public RolloutReplica {
 public:
  FakeRollout(std::string address, int fail_from_call = -1, absl::Status failure = absl::UnavailableError("gone"),
              absl::Duration latency = absl::ZeroDuration())
      : address_(std::move(address)), fail_from_(fail_from_call), failure_(std::move(failure)), latency_(latency) {}
  std::string address() const override { return address_; }
  absl::Status GenerateBatch(const v1::GenerateBatchRequest& request,
                             v1::GenerateBatchResponse* response) override {
    absl::SleepFor(latency_);  // a slow (or loaded) replica
    absl::MutexLock lock(&mu_);
    if (fail_from_ >= 0 && calls_ >= fail_from_) return failure_;
    ++calls_;
    for (const auto& p : request.prompts()) {
      ++prompts_;
      const std::string answer = *tasks::FindTask(p.task())->Solve(p.prompt_id());
      const std::vector<int32_t> tokens = *model::Tokenizer::EncodeResponse(answer);
      for (uint32_t s = 0; s < request.num_samples(); ++s) {
        v1::Experience* e = response->add_completions();
        e->mutable_experience_id()->set_value(absl::StrCat(address_, "-", ids_++));
        e->set_task(p.task());
        e->set_group_id(p.group_id());
        for (int32_t t : tokens) {
          e->add_response_token_ids(t);
          e->add_token_policy_versions(version_);
        }
      }
    }
    return absl::OkStatus();
  }
  absl::Status UpdateWeights(const v1::PrepareWeightsRequest& request) override {
    absl::MutexLock lock(&mu_);
    version_ = request.manifest().version().version();
    ++updates_;
    return absl::OkStatus();
  }
  absl::Status Drain() override {
    absl::MutexLock lock(&mu_);
    *drained_ = true;
    return absl::OkStatus();
  }
  uint64_t version() {
    absl::MutexLock lock(&mu_);
    return version_;
  }
  // Whether it was drained; the flag outlives the replica (a pool that removes a
  // replica destroys it).
  std::shared_ptr<std::atomic<bool>> drained_flag() const { return drained_; }
  int prompts() {
    absl::MutexLock lock(&mu_);
    return prompts_;
  }

 private:
  const std::string address_;
  const int fail_from_;
  const absl::Status failure_;
  const absl::Duration latency_;
  absl::Mutex mu_;
  int calls_ = 0, prompts_ = 0, ids_ = 0, updates_ = 0;
  uint64_t version_ = 0;
  const std::shared_ptr<std::atomic<bool>> drained_ = std::make_shared<std::atomic<bool>>(false);
};

class FakeReward : public RewardPeer {
 public:
  absl::Status Score(const v1::ScoreRequest& request, v1::ScoreResponse* response) override {
    for (const auto& item : request.items()) {
      response->add_results()->set_reward(item.response_text() == item.reference_answer() ? 1.0f : 0.0f);
    }
    return absl::OkStatus();
  }
};

class FakeBuffer : public BufferPeer {
 public:
  absl::Status Configure(const v1::ConfigureRequest&) override { return absl::OkStatus(); }
  absl::Status PutExperiences(const v1::PutExperiencesRequest& request) override {
    experiences += request.experiences_size();
    for (const auto& e : request.experiences()) {
      EXPECT_TRUE(ids.insert(e.experience_id().value()).second) << "duplicate " << e.experience_id().value();
    }
    return absl::OkStatus();
  }
  int experiences = 0;
  std::set<std::string> ids;
};

class FakeTrainer : public TrainerPeer {
 public:
  absl::Status TrainStep(const v1::TrainStepRequest& request, v1::TrainStepResponse* response) override {
    last_max_staleness = request.buffer().max_staleness();
    response->mutable_metrics()->set_entropy(0.5f);
    ++steps;
    return absl::OkStatus();
  }
  absl::Status PublishWeights(v1::PublishWeightsResponse* response) override {
    response->mutable_manifest()->mutable_version()->set_version(++version);
    return absl::OkStatus();
  }
  int steps = 0;
  uint64_t version = 0;
  uint32_t last_max_staleness = 0;
};

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

// The loop over given rollout replicas and fake reward, buffer and trainer.
struct FakeRun {
  explicit FakeRun(std::vector<std::unique_ptr<RolloutReplica>> replicas, RolloutPool::Log log = nullptr)
      : pool(std::move(replicas), std::move(log)) {}
  absl::Status Run(const LoopConfig& config, bool stopped = false) {
    std::atomic<bool> stop{stopped};
    return RunLoop(config, pool, reward, buffer, trainer, stop,
                   [this](const LoopProgress& p) { progress.push_back(p); });
  }
  RolloutPool pool;
  FakeReward reward;
  FakeBuffer buffer;
  FakeTrainer trainer;
  std::vector<LoopProgress> progress;
};

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
}

TEST(RolloutPool, EveryReplicaGetsWorkAndAFasterOneTakesMore) {
  auto fast = std::make_unique<FakeRollout>("fast");
  auto slow = std::make_unique<FakeRollout>("slow", -1, absl::OkStatus(), absl::Milliseconds(50));
  FakeRollout* f = fast.get();
  FakeRollout* s = slow.get();
  RolloutPool pool(Pool(std::move(fast), std::move(slow)), nullptr);
  v1::GenerateBatchRequest request;
  request.set_num_samples(2);
  for (int i = 0; i < 32; ++i) {
    v1::BatchPrompt* p = request.add_prompts();
    p->set_task("reverse");
    p->set_prompt_id(absl::StrCat("reverse:", 100 + i));
    p->set_group_id(absl::StrCat("g", i));
  }
  v1::GenerateBatchResponse response;
  ASSERT_TRUE(pool.Generate(request, &response).ok());
  // All completions, in prompt order.
  ASSERT_EQ(response.completions_size(), 64);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(response.completions(2 * i).group_id(), absl::StrCat("g", i));
  EXPECT_EQ(f->prompts() + s->prompts(), 32);
  EXPECT_GT(s->prompts(), 0);
  EXPECT_GT(f->prompts(), 2 * s->prompts()) << "fast " << f->prompts() << ", slow " << s->prompts();
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
    if (p.step == 2) EXPECT_TRUE(run.pool.Remove("a").ok());  // scale down: a drains and leaves
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

TEST(RunLoop, StopsWhenAskedAndWhenNoReplicaIsLeft) {
  {
    FakeRun run(Pool(std::make_unique<FakeRollout>("a")));
    ASSERT_TRUE(run.Run(Small(), /*stopped=*/true).ok());
    EXPECT_EQ(run.progress.size(), 0u);
  }
  FakeRun run(Pool(std::make_unique<FakeRollout>("a", 0)));
  absl::Status s = run.Run(Small());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "step 1")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "no rollout replica left")) << s;
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

TEST(RunManager, StartRunsAndStopStops) {
  auto factory = []() -> absl::StatusOr<RunPeers> {
    RunPeers peers;
    peers.rollouts.push_back(std::make_unique<FakeRollout>("a"));
    peers.reward = std::make_unique<FakeReward>();
    peers.buffer = std::make_unique<FakeBuffer>();
    peers.trainer = std::make_unique<FakeTrainer>();
    return peers;
  };
  RunManager runs(factory, nullptr);
  v1::RunConfig c;
  c.set_total_steps(0);  // until stopped
  c.set_batch_size(2);
  c.set_group_size(2);
  c.set_eval_interval_steps(1);
  auto id = runs.Start(c, "");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(runs.Start(c, "").status().code(), absl::StatusCode::kFailedPrecondition);
  v1::StopRunResponse stopped;
  ASSERT_TRUE(runs.Stop("", absl::Seconds(30), &stopped).ok());
  EXPECT_EQ(stopped.state(), v1::RUN_STATE_STOPPED);
  v1::GetStatusResponse status;
  runs.Fill(&status);
  EXPECT_EQ(status.run_id(), *id);
  EXPECT_EQ(status.state(), v1::RUN_STATE_STOPPED);
  EXPECT_EQ(runs.Stop("other", absl::Seconds(1), &stopped).code(), absl::StatusCode::kNotFound);
  // A finished run makes room for the next.
  c.set_total_steps(2);
  ASSERT_TRUE(runs.Start(c, "second").ok());
}

// A controller's registry (in memory) with replicas registered through its core.
struct Registry {
  Registry() : registry(*registry::OpenRegistry("memory://", common::Clock::Real())), core(registry.get(), common::Clock::Real()) {
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
  auto has = [&](const std::string& a) {
    auto all = runs.RolloutAddresses();
    return std::find(all.begin(), all.end(), a) != all.end();
  };
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
  ASSERT_TRUE(runs.Stop("", absl::Seconds(30), &stopped).ok());
  discovery->reset();
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(logs.empty()) << logs.front();
}

}  // namespace
}  // namespace rlfleet::controller

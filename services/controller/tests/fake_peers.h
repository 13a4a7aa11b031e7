// Fakes of the run loop's peers (run_loop.h) that behave as the real services do where
// a run depends on it: rollout experience ids are <request id>:<prompt>:<sample>, a
// replica refuses a version that is not newer than its own with FAILED_PRECONDITION,
// the buffer refuses ids it has seen, and the trainer (linked to the buffer) answers
// UNAVAILABLE when no group has a learning signal. Thread-safe where the pool calls
// them concurrently (FakeRollout).
#ifndef RLFLEET_SERVICES_CONTROLLER_TESTS_FAKE_PEERS_H_
#define RLFLEET_SERVICES_CONTROLLER_TESTS_FAKE_PEERS_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/model/tokenizer.h"
#include "libs/tasks/tasks.h"
#include "services/controller/run_loop.h"
#include "services/controller/run_manager.h"

namespace rlfleet::controller {

// Answers every prompt correctly; can be made to fail from its n-th call on.
class FakeRollout : public RolloutReplica {
 public:
  FakeRollout(std::string address, int fail_from_call = -1, absl::Status failure = absl::UnavailableError("gone"),
              absl::Duration latency = absl::ZeroDuration())
      : address_(std::move(address)), fail_from_(fail_from_call), failure_(std::move(failure)), latency_(latency) {}
  std::string address() const override { return address_; }
  absl::Status GenerateBatch(const v1::GenerateBatchRequest& request, v1::GenerateBatchResponse* response) override {
    absl::SleepFor(latency_);  // a slow (or loaded) replica
    absl::MutexLock lock(&mu_);
    if (fail_from_ >= 0 && calls_ >= fail_from_) return failure_;
    if (fail_next_ > 0) {
      --fail_next_;
      return next_failure_;
    }
    ++calls_;
    for (int i = 0; i < request.prompts_size(); ++i) {
      const v1::BatchPrompt& p = request.prompts(i);
      ++prompts_;
      const tasks::Task* task = tasks::FindTask(p.task());
      const std::string answer = *task->Solve(p.prompt_id());
      std::vector<int32_t> tokens = *model::Tokenizer::EncodeResponse(answer);
      if (task->UsesCalculator() && p.prompt_token_ids(p.prompt_token_ids_size() - 1) != model::Tokenizer::kEndResult) {
        // A first turn: the call, as a perfect policy writes it; the answer follows the
        // tool's result (a continuation).
        const std::string demo = *task->Demonstration(p.prompt_id());
        tokens = *model::Tokenizer::EncodeResponse(demo.substr(0, demo.find(']') + 1));
        tokens.pop_back();  // (EOS)
      }
      for (uint32_t s = 0; s < request.num_samples(); ++s) {
        v1::Experience* e = response->add_completions();
        // As the real replica names them: unique only as far as request ids are.
        e->mutable_experience_id()->set_value(absl::StrCat(request.request_id(), ":", i, ":", s));
        e->set_task(p.task());
        e->set_group_id(p.group_id());
        e->set_prompt_id(p.prompt_id());
        e->set_finish_reason(v1::FINISH_REASON_STOP);
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
    if (!update_failure_.ok()) return update_failure_;
    const uint64_t v = request.manifest().version().version();
    if (v <= version_) {  // as rollout_core: not newer than the installed one
      return absl::FailedPreconditionError(absl::StrCat("version ", v, " is not newer than the installed ", version_));
    }
    version_ = v;
    ++updates_;
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> InstalledVersion() override {
    absl::MutexLock lock(&mu_);
    return version_;
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
  // Serves `version` already (e.g. from another fleet's run).
  void SetVersion(uint64_t version) {
    absl::MutexLock lock(&mu_);
    version_ = version;
  }
  // Its next `count` GenerateBatch calls answer `failure` (a transient one).
  void FailNext(int count, absl::Status failure) {
    absl::MutexLock lock(&mu_);
    fail_next_ = count;
    next_failure_ = std::move(failure);
  }
  // Every UpdateWeights answers `failure` from now on.
  void FailUpdates(absl::Status failure) {
    absl::MutexLock lock(&mu_);
    update_failure_ = std::move(failure);
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
  int calls_ = 0, prompts_ = 0, updates_ = 0, fail_next_ = 0;
  absl::Status next_failure_;
  uint64_t version_ = 0;
  absl::Status update_failure_;
  const std::shared_ptr<std::atomic<bool>> drained_ = std::make_shared<std::atomic<bool>>(false);
};

class FakeReward : public RewardPeer {
 public:
  enum class Mode {
    kExact,      // 1 for the reference answer, else 0
    kAlternate,  // the exact reward for even items, 0.5 for odd ones: every group varies
    kConstant,   // 0 for all: no group has a learning signal
  };
  explicit FakeReward(Mode mode = Mode::kExact) : mode_(mode) {}
  absl::Status Score(const v1::ScoreRequest& request, v1::ScoreResponse* response) override {
    absl::MutexLock lock(&mu_);  // (a fully asynchronous run scores from several threads)
    for (int i = 0; i < request.items_size(); ++i) {
      const auto& item = request.items(i);
      scored_prompts.push_back(item.prompt_text());
      const tasks::Task* task = tasks::FindTask(item.task());
      const std::string answer = task != nullptr ? task->FinalAnswer(item.response_text()) : item.response_text();
      const float exact = answer == item.reference_answer() ? 1.0f : 0.0f;
      response->add_results()->set_reward(mode_ == Mode::kConstant                  ? 0.0f
                                          : mode_ == Mode::kAlternate && i % 2 == 1 ? 0.5f
                                                                                    : exact);
    }
    return absl::OkStatus();
  }
  std::vector<std::string> scored_prompts;  // every item's prompt, in order

 private:
  const Mode mode_;
  absl::Mutex mu_;
};

// Holds groups as the real buffer does for the loop: an id it has seen is a duplicate;
// a group whose rewards all agree has no learning signal.
class FakeBuffer : public BufferPeer {
 public:
  absl::Status Configure(const v1::ConfigureRequest& request) override {
    configured.push_back(request);
    return absl::OkStatus();
  }
  absl::Status PutExperiences(const v1::PutExperiencesRequest& request, v1::PutExperiencesResponse* response) override {
    absl::MutexLock lock(&mu_);  // (a fully asynchronous run puts from several threads)
    for (const auto& e : request.experiences()) {
      if (!ids.insert(e.experience_id().value()).second) {
        ++duplicates;
        response->set_duplicates(response->duplicates() + 1);
        response->add_duplicate_ids()->set_value(e.experience_id().value());
        continue;
      }
      ++experiences;
      stored.push_back(e);
      response->set_accepted(response->accepted() + 1);
      groups[e.group_id()].push_back(e.reward());
    }
    return absl::OkStatus();
  }
  absl::StatusOr<v1::GetStatsResponse> Stats() override {
    absl::MutexLock lock(&mu_);
    v1::GetStatsResponse stats;
    stats.set_complete_groups(groups.size());
    return stats;
  }
  // Takes up to `limit` held groups (0: every one); returns how many had a learning
  // signal and adds their experiences to *sequences.
  int TakeGroupsWithSignal(uint32_t limit = 0, uint32_t* sequences = nullptr) {
    absl::MutexLock lock(&mu_);
    int n = 0;
    uint32_t taken = 0;
    for (auto it = groups.begin(); it != groups.end() && (limit == 0 || taken < limit); ++taken) {
      const std::vector<float>& rewards = it->second;
      double sum = 0, sq = 0;
      for (float r : rewards) {
        sum += r;
        sq += static_cast<double>(r) * r;
      }
      const double mean = sum / rewards.size();
      const bool signal = std::sqrt(std::max(0.0, sq / rewards.size() - mean * mean)) > 1e-6;
      n += signal;
      if (signal && sequences != nullptr) *sequences += rewards.size();
      it = groups.erase(it);
    }
    return n;
  }
  int experiences = 0, duplicates = 0;
  std::vector<v1::Experience> stored;  // every accepted experience
  std::set<std::string> ids;
  std::map<std::string, std::vector<float>> groups;  // held, by group id
  std::vector<v1::ConfigureRequest> configured;

 private:
  absl::Mutex mu_;
};

// Version 1 to start with, one more per step. Linked to a FakeBuffer, it trains on the
// buffer's groups and answers UNAVAILABLE when none has a signal (as the real trainer
// does); `unavailable` more UNAVAILABLE answers come first (a trainer restarting).
class FakeTrainer : public TrainerPeer {
 public:
  explicit FakeTrainer(FakeBuffer* buffer = nullptr) : buffer_(buffer) {}
  absl::Status TrainStep(const v1::TrainStepRequest& request, v1::TrainStepResponse* response) override {
    ++calls;
    if (unavailable > 0) {
      --unavailable;
      return absl::UnavailableError("trainer: connection refused");
    }
    uint32_t sequences = 0;
    if (buffer_ != nullptr &&
        buffer_->TakeGroupsWithSignal(limit_to_num_groups ? request.buffer().num_groups() : 0, &sequences) == 0) {
      return absl::UnavailableError("the buffer had no complete groups within wait_ms; retry");
    }
    if (lose_replies > 0) {  // killed after its ack: the groups are gone, so is the update
      --lose_replies;
      return absl::UnavailableError("trainer: connection reset");
    }
    last_max_staleness = request.buffer().max_staleness();
    last_params = request.params();
    response->mutable_metrics()->set_entropy(0.5f);
    response->mutable_metrics()->set_sequences(limit_to_num_groups ? sequences : 1);
    ++steps;
    ++version;
    return absl::OkStatus();
  }
  absl::Status PublishWeights(const v1::PublishWeightsRequest& request, v1::PublishWeightsResponse* response) override {
    if (request.min_version() > version) version = request.min_version();  // (renumbered, as the trainer does)
    last_min_version = request.min_version();
    response->mutable_manifest()->mutable_version()->set_version(version);
    ++publishes;
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> PolicyVersion() override { return version; }
  absl::Status SaveCheckpoint(const v1::SaveCheckpointRequest& request, v1::SaveCheckpointResponse* response) override {
    if (!checkpoint_failure.ok()) return checkpoint_failure;
    if (request.dry_run()) {
      checked_checkpoints.push_back(request.path());
      return absl::OkStatus();
    }
    if (fail_every_save || std::find(failing_checkpoints.begin(), failing_checkpoints.end(), request.path()) !=
                               failing_checkpoints.end()) {
      failed_checkpoints.push_back(request.path());
      return absl::ResourceExhaustedError("no space left on device");
    }
    keep_last.push_back(request.keep_last());
    checkpoints.push_back(request.path());
    response->set_path(request.path());
    response->set_step(steps);
    return absl::OkStatus();
  }
  int steps = 0, calls = 0, publishes = 0;
  int unavailable = 0;   // UNAVAILABLE answers to give first
  int lose_replies = 0;  // steps that consume their batch, then answer UNAVAILABLE
  // Takes at most the request's num_groups groups, and reports their sequences (else
  // every group, and 1 sequence).
  bool limit_to_num_groups = false;
  uint64_t version = 1;
  uint64_t last_min_version = 0;
  uint32_t last_max_staleness = 0;
  v1::AlgorithmParams last_params;
  std::vector<std::string> checkpoints;
  std::vector<std::string> checked_checkpoints;  // dry runs
  absl::Status checkpoint_failure;
  // Saves of these paths fail (a full disk), each attempt kept in failed_checkpoints.
  std::vector<std::string> failing_checkpoints;
  bool fail_every_save = false;  // (dry runs pass)
  std::vector<std::string> failed_checkpoints;
  std::vector<uint32_t> keep_last;  // of each save that succeeded

 private:
  FakeBuffer* const buffer_;
};

// The loop over given rollout replicas and fake reward, buffer and trainer; every
// step's progress is kept in `progress`.
struct FakeRun {
  explicit FakeRun(std::vector<std::unique_ptr<RolloutReplica>> replicas, RolloutPool::Log log = nullptr)
      : pool(std::move(replicas), std::move(log)) {}
  absl::Status Run(const LoopConfig& config, bool stopped = false) {
    std::atomic<bool> stop{stopped};
    return RunLoop(config, pool, reward, buffer, trainer, stop,
                   [this](const LoopProgress& p) { progress.push_back(p); });
  }
  // Runs until `stop_after` says so after a step (a controller that goes away then).
  absl::Status RunUntil(const LoopConfig& config, const std::function<bool(const LoopProgress&)>& stop_after) {
    std::atomic<bool> stop{false};
    return RunLoop(config, pool, reward, buffer, trainer, stop, [&](const LoopProgress& p) {
      progress.push_back(p);
      if (stop_after(p)) stop = true;
    });
  }
  RolloutPool pool;
  FakeReward reward;
  FakeBuffer buffer;
  FakeTrainer trainer;
  std::vector<LoopProgress> progress;
};

// Whether `address` is a live rollout replica of `runs`' active run.
inline bool InRun(RunManager& runs, const std::string& address) {
  const std::vector<std::string> all = runs.RolloutAddresses();
  return std::find(all.begin(), all.end(), address) != all.end();
}

// Run peers for a RunManager: one fake rollout replica ("a"), reward, buffer and trainer.
inline absl::StatusOr<RunPeers> OneReplicaFakePeers() {
  RunPeers peers;
  peers.rollouts.push_back(std::make_unique<FakeRollout>("a"));
  peers.reward = std::make_unique<FakeReward>();
  peers.buffer = std::make_unique<FakeBuffer>();
  peers.trainer = std::make_unique<FakeTrainer>();
  return peers;
}

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_TESTS_FAKE_PEERS_H_

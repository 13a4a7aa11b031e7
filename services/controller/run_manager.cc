#include "services/controller/run_manager.h"

#include <filesystem>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libs/common/ids.h"
#include "services/controller/run_metrics.h"

namespace rlfleet::controller {
namespace {

bool Terminal(v1::RunState s) {
  return s == v1::RUN_STATE_IDLE || s == v1::RUN_STATE_STOPPED || s == v1::RUN_STATE_COMPLETED ||
         s == v1::RUN_STATE_FAILED;
}

absl::Status Field(const std::string& field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("config.", field, ": ", problem));
}

}  // namespace

absl::StatusOr<LoopConfig> LoopConfigFromRun(const v1::RunConfig& c) {
  LoopConfig loop;
  if (!c.task().empty()) loop.task = c.task();
  for (const auto& [key, value] : c.task_params()) {
    int n = 0;
    if (!absl::SimpleAtoi(value, &n)) return Field(absl::StrCat("task_params[", key, "]"), "not an integer");
    if (key == "min_len") {
      loop.min_len = n;
    } else if (key == "max_len") {
      loop.max_len = n;
    } else {
      return Field(absl::StrCat("task_params[", key, "]"), "unknown (min_len, max_len)");
    }
  }
  if (c.algorithm() != v1::ALGORITHM_UNSPECIFIED && c.algorithm() != v1::ALGORITHM_GRPO) {
    return Field("algorithm", "the controller's loop runs GRPO only so far");
  }
  if (c.group_size() != 0) loop.samples = static_cast<int>(c.group_size());
  if (c.batch_size() != 0) loop.prompts = static_cast<int>(c.batch_size());
  if (c.learning_rate() != 0) loop.lr = c.learning_rate();
  loop.steps = c.total_steps() == 0 ? std::numeric_limits<int>::max()
                                     : static_cast<int>(std::min<uint64_t>(c.total_steps(), 1u << 30));
  loop.max_staleness = static_cast<int>(std::min<uint32_t>(c.max_staleness(), 1000));
  if (c.seed() != 0) loop.seed = c.seed();
  loop.eval_every = static_cast<int>(c.eval_interval_steps());
  if (c.temperature() != 0) loop.temperature = c.temperature();
  if (c.ppo_epochs() != 0) loop.ppo_epochs = static_cast<int>(c.ppo_epochs());
  loop.entropy_coef = c.entropy_coef();
  loop.stop_at = c.stop_at_exact_match() > 0 ? c.stop_at_exact_match() : 2.0;
  if (absl::Status s = ValidateLoopConfig(loop); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", s.message()));
  }
  return loop;
}

RunManager::RunManager(PeerFactory peers, std::function<void(const std::string&)> log,
                       std::string runs_dir)
    : peers_(std::move(peers)), log_(std::move(log)), runs_dir_(std::move(runs_dir)) {}

RunManager::~RunManager() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::string> RunManager::Start(const v1::RunConfig& config, const std::string& run_id) {
  absl::StatusOr<LoopConfig> loop = LoopConfigFromRun(config);
  if (!loop.ok()) return loop.status();
  {
    absl::MutexLock lock(&mu_);
    if (!Terminal(state_)) {
      return absl::FailedPreconditionError(
          absl::StrCat("run ", run_id_, " is active; StopRun it first"));
    }
  }
  absl::StatusOr<RunPeers> peers = peers_();
  if (!peers.ok()) return peers.status();
  if (thread_.joinable()) thread_.join();  // the previous run's thread has finished
  const std::string id = run_id.empty() ? common::NewId("run") : run_id;
  {
    absl::MutexLock lock(&mu_);
    run_id_ = id;
    state_ = v1::RUN_STATE_STARTING;
    config_ = config;
    progress_ = LoopProgress();
    last_exact_ = 0;
    started_ = absl::Now();
    error_.clear();
    run_dir_ = runs_dir_.empty() ? "" : (std::filesystem::path(runs_dir_) / id).string();
    stop_requested_ = false;
  }
  stop_ = false;
  thread_ = std::thread([this, l = *loop, p = std::move(*peers)]() mutable { Body(l, std::move(p)); });
  if (log_) log_(absl::StrCat("run ", id, " started: ", config.ShortDebugString()));
  return id;
}

absl::Status RunManager::AdmitRollout(std::unique_ptr<RolloutReplica> replica) {
  absl::MutexLock lock(&pool_mu_);
  if (pool_ == nullptr) return absl::FailedPreconditionError("no active run to admit a rollout replica to");
  return pool_->Admit(std::move(replica));
}

absl::Status RunManager::RemoveRollout(const std::string& address) {
  absl::MutexLock lock(&pool_mu_);
  if (pool_ == nullptr) return absl::FailedPreconditionError("no active run");
  return pool_->Remove(address);
}

std::vector<std::string> RunManager::RolloutAddresses() {
  absl::MutexLock lock(&pool_mu_);
  return pool_ == nullptr ? std::vector<std::string>{} : pool_->addresses();
}

void RunManager::Body(LoopConfig config, RunPeers peers) {
  RolloutPool pool(std::move(peers.rollouts), log_);
  RunMetrics metrics;
  bool write_metrics = false;
  {
    std::string dir;
    {
      absl::MutexLock lock(&mu_);
      dir = run_dir_;
    }
    if (!dir.empty()) {
      absl::Status opened = metrics.Open(dir);
      write_metrics = opened.ok();
      if (!opened.ok() && log_) log_(absl::StrCat("run metrics: ", opened.message()));
    }
  }
  absl::Time last_log = absl::InfinitePast();
  auto on_progress = [&](const LoopProgress& p) {
    if (write_metrics) metrics.Add(p);
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      state_ = v1::RUN_STATE_RUNNING;
      progress_ = p;
      if (p.held_out_exact) last_exact_ = static_cast<float>(*p.held_out_exact);
      id = run_id_;
    }
    // Outside the lock (a slow stdout must not stall GetStatus), and at most every 5 s.
    if (log_ && p.held_out_exact && absl::Now() - last_log >= absl::Seconds(5)) {
      last_log = absl::Now();
      log_(absl::StrFormat("run %s step %d: train reward %.3f, held-out exact %.3f, policy v%d", id, p.step,
                           p.train_reward, *p.held_out_exact, p.policy_version));
    }
  };
  {
    absl::MutexLock lock(&pool_mu_);
    pool_ = &pool;
  }
  absl::Status s = RunLoop(config, pool, *peers.reward, *peers.buffer, *peers.trainer, stop_, on_progress);
  {
    absl::MutexLock lock(&pool_mu_);
    pool_ = nullptr;
  }
  std::string line;
  {
    absl::MutexLock lock(&mu_);
    if (!s.ok()) {
      state_ = v1::RUN_STATE_FAILED;
      error_ = s.ToString();
    } else {
      state_ = stop_requested_ ? v1::RUN_STATE_STOPPED : v1::RUN_STATE_COMPLETED;
    }
    line = absl::StrCat("run ", run_id_, " ", v1::RunState_Name(state_), " after ", progress_.step, " steps",
                        s.ok() ? "" : ": " + error_);
  }
  if (log_) log_(line);
  if (write_metrics && log_) log_(metrics.Finish());
}

absl::Status RunManager::Stop(const std::string& run_id, absl::Duration grace,
                              v1::StopRunResponse* response) {
  {
    absl::MutexLock lock(&mu_);
    if (!run_id.empty() && run_id != run_id_) {
      return absl::NotFoundError(absl::StrCat("run_id: no run ", run_id, " (current: ", run_id_, ")"));
    }
    if (!Terminal(state_)) {
      stop_requested_ = true;
      state_ = v1::RUN_STATE_STOPPING;
    }
  }
  stop_ = true;
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return Terminal(state_); };
  mu_.AwaitWithTimeout(absl::Condition(&done), grace);
  response->set_state(state_);
  response->set_step(progress_.step);
  return absl::OkStatus();
}

void RunManager::Fill(v1::GetStatusResponse* response) {
  absl::MutexLock lock(&mu_);
  if (run_id_.empty()) return;
  response->set_run_id(run_id_);
  response->set_state(state_);
  response->set_step(progress_.step);
  *response->mutable_config() = config_;
  response->set_started_at_unix_ms(absl::ToUnixMillis(started_));
  response->set_error(error_);
  response->set_run_dir(run_dir_);
  v1::MetricsSummary* m = response->mutable_metrics();
  m->set_reward_mean(static_cast<float>(progress_.train_reward));
  m->set_eval_exact_match(last_exact_);
  m->set_elapsed_ms(absl::ToDoubleMilliseconds(absl::Now() - started_));
  m->set_rollout_tokens_per_s(progress_.tokens_per_s);
  m->set_train_step_ms(progress_.train_seconds * 1e3);
  m->set_weight_sync_ms(progress_.sync_seconds * 1e3);
  m->set_mean_staleness(progress_.mean_staleness);
  m->set_loss(progress_.loss);
  if (progress_.policy_version > response->policy_version().version()) {
    response->mutable_policy_version()->set_version(progress_.policy_version);
  }
}

}  // namespace rlfleet::controller

#include "services/controller/run_manager.h"

#include <filesystem>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libs/common/checks.h"
#include "libs/common/files.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"
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

// Largest total_steps, eval and checkpoint interval (they become an int).
constexpr uint64_t kMaxSteps = 1u << 30;

// A checkpoint folder is a path on the trainer's machine, which resolves it under its
// checkpoint root; here only its form is checked: printable, bounded, and no ".."
// component (so it cannot climb out of that root whatever the trainer does).
absl::Status ValidateCheckpointDir(const std::string& dir) {
  if (dir.size() > 1024) return Field("checkpoint_dir", absl::StrCat(dir.size(), " bytes; at most 1024"));
  for (char ch : dir) {
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) return Field("checkpoint_dir", "has a control character");
  }
  for (absl::string_view part : absl::StrSplit(dir, '/')) {
    if (part == "..") return Field("checkpoint_dir", "has a `..` component");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoopConfig> LoopConfigFromRun(const v1::RunConfig& c, const std::string& data_root) {
  LoopConfig loop;
  if (!c.task().empty()) loop.task = c.task();
  if (!c.dataset().empty()) {
    if (!c.task().empty()) {
      return Field("task", "set with dataset: leave it empty (dataset_task names the reward task)");
    }
    // Paths a caller sends are files on this machine: only under --data_root.
    ASSIGN_OR_RETURN(std::filesystem::path dataset, common::ResolveUnderRoot("config.dataset", data_root, c.dataset()));
    if (c.tokenizer_dir().empty()) return Field("tokenizer_dir", "empty; a dataset needs the model directory");
    ASSIGN_OR_RETURN(std::filesystem::path tokenizer,
                     common::ResolveUnderRoot("config.tokenizer_dir", data_root, c.tokenizer_dir()));
    loop.dataset = dataset.string();
    loop.tokenizer_dir = tokenizer.string();
    if (!c.prompt_field().empty()) loop.prompt_field = c.prompt_field();
    if (!c.answer_field().empty()) loop.answer_field = c.answer_field();
    if (!c.dataset_task().empty()) loop.dataset_task = c.dataset_task();
    loop.apply_chat_template = c.apply_chat_template();
    loop.chat_template_kwargs = c.chat_template_kwargs();
  } else if (!c.tokenizer_dir().empty() || !c.prompt_field().empty() || !c.answer_field().empty() ||
             !c.dataset_task().empty() || c.apply_chat_template() || !c.chat_template_kwargs().empty()) {
    return Field(
        "tokenizer_dir / prompt_field / answer_field / dataset_task / apply_chat_template / "
        "chat_template_kwargs",
        "set without a dataset");
  }
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
  if (c.has_model() && c.model().ByteSizeLong() > 0) {
    return absl::UnimplementedError(
        "config.model: a run cannot choose the model yet; it is the trainer's and the rollout replicas' "
        "(--d_model, --n_layers, ... flags)");
  }
  if (c.algorithm() != v1::ALGORITHM_UNSPECIFIED && c.algorithm() != v1::ALGORITHM_GRPO) {
    return absl::UnimplementedError(absl::StrCat("config.algorithm: ", v1::Algorithm_Name(c.algorithm()),
                                                 " is not implemented; the controller's loop runs GRPO only so far"));
  }
  // Each number in its own type before it becomes an int; NaN before any comparison.
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("config.group_size", c.group_size(), 0, 64));
  if (c.group_size() == 1) return Field("group_size", "1; GRPO needs groups of 2..64 (0 = 8)");
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("config.batch_size", c.batch_size(), 0, 1024));
  RETURN_IF_ERROR(common::CheckFiniteInRange("config.learning_rate", c.learning_rate(), 0, 1));
  RETURN_IF_ERROR(common::CheckInRange<uint64_t>("config.total_steps", c.total_steps(), 0, kMaxSteps));
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("config.max_staleness", c.max_staleness(), 0, 64));
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("config.rollout_replicas", c.rollout_replicas(), 0, 1024));
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("config.eval_interval_steps", c.eval_interval_steps(), 0, kMaxSteps));
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("config.max_new_tokens", c.max_new_tokens(), 0, 4096));
  RETURN_IF_ERROR(common::CheckFiniteInRange("config.temperature", c.temperature(), 0, 10));
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("config.ppo_epochs", c.ppo_epochs(), 0, 16));
  RETURN_IF_ERROR(common::CheckFiniteInRange("config.clip_ratio", c.clip_ratio(), 0, 1));
  RETURN_IF_ERROR(common::CheckFiniteInRange("config.clip_ratio_high", c.clip_ratio_high(), 0, 10));
  RETURN_IF_ERROR(
      common::CheckInRange<uint32_t>("config.checkpoint_interval_steps", c.checkpoint_interval_steps(), 0, kMaxSteps));
  RETURN_IF_ERROR(common::CheckFiniteInRange("config.entropy_coef", c.entropy_coef(), 0, 10));
  RETURN_IF_ERROR(common::CheckFiniteInRange("config.stop_at_exact_match", c.stop_at_exact_match(), 0, 1));
  if (c.group_size() != 0) loop.samples = static_cast<int>(c.group_size());
  if (c.batch_size() != 0) loop.prompts = static_cast<int>(c.batch_size());
  if (c.learning_rate() != 0) loop.lr = c.learning_rate();
  loop.steps = c.total_steps() == 0 ? std::numeric_limits<int>::max() : static_cast<int>(c.total_steps());
  loop.max_staleness = static_cast<int>(c.max_staleness());
  if (c.fully_async() && c.max_staleness() == 0) {
    return Field("fully_async", "set with max_staleness 0; it needs max_staleness >= 1");
  }
  loop.fully_async = c.fully_async();
  if (c.seed() != 0) loop.seed = c.seed();
  loop.eval_every = static_cast<int>(c.eval_interval_steps());
  loop.max_new_tokens = static_cast<int>(c.max_new_tokens());
  if (c.temperature() != 0) loop.temperature = c.temperature();
  if (c.ppo_epochs() != 0) loop.ppo_epochs = static_cast<int>(c.ppo_epochs());
  if (c.clip_ratio() != 0) loop.clip_ratio = c.clip_ratio();
  loop.clip_ratio_high = c.clip_ratio_high();
  loop.entropy_coef = c.entropy_coef();
  loop.stop_at = c.stop_at_exact_match() > 0 ? c.stop_at_exact_match() : 2.0;
  if (!c.checkpoint_dir().empty()) RETURN_IF_ERROR(ValidateCheckpointDir(c.checkpoint_dir()));
  if (c.checkpoint_interval_steps() > 0 && c.checkpoint_dir().empty()) {
    return Field("checkpoint_interval_steps", "set, but checkpoint_dir is empty (where would they go?)");
  }
  loop.checkpoint_dir = c.checkpoint_dir();
  loop.checkpoint_every = static_cast<int>(c.checkpoint_interval_steps());
  if (c.has_checkpoint_keep_last()) {
    RETURN_IF_ERROR(common::CheckInRange<uint32_t>("config.checkpoint_keep_last", c.checkpoint_keep_last(), 0,
                                                   kMaxCheckpointKeepLast));
    loop.checkpoint_keep_last = static_cast<int>(c.checkpoint_keep_last());
  }
  if (absl::Status s = ValidateLoopConfig(loop); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", s.message()));
  }
  return loop;
}

RunManager::RunManager(PeerFactory peers, std::function<void(const std::string&)> log, std::string runs_dir,
                       RunStore* store, std::string data_root)
    : peers_(std::move(peers)),
      log_(std::move(log)),
      runs_dir_(std::move(runs_dir)),
      data_root_(std::move(data_root)),
      store_(store) {}

void RunManager::Persist() {
  if (store_ == nullptr) return;
  absl::MutexLock store_lock(&store_mu_);
  RunRecord record;
  {
    absl::MutexLock lock(&mu_);
    if (run_id_.empty()) return;
    record.run_id = run_id_;
    record.config = config_;
    record.state = state_;
    record.started_unix_ms = absl::ToUnixMillis(started_);
    record.run_dir = run_dir_;
    record.error = error_;
    record.stop_requested = stop_requested_;
    record.last_exact = last_exact_;
    record.resumes = resumes_;
    record.progress = progress_;
    if (record.progress.last_checkpoint.empty()) record.progress.last_checkpoint = checkpoint_path_;
  }
  const absl::Status saved = store_->Save(record);
  if (!saved.ok() && !store_failing_ && log_) {
    log_(absl::StrCat("run ", record.run_id, ": cannot save the run's record (", saved.ToString(),
                      "); a controller restarted now would resume it from an earlier step"));
  }
  if (saved.ok() && store_failing_ && log_) log_(absl::StrCat("run ", record.run_id, ": its record is saved again"));
  store_failing_ = !saved.ok();
}

absl::Status RunManager::Recover(absl::Duration peers_within) {
  if (store_ == nullptr) return absl::OkStatus();
  absl::MutexLock starting(&start_mu_);
  absl::StatusOr<std::optional<RunRecord>> loaded = store_->Load();
  if (!loaded.ok()) return common::Annotate(loaded.status(), "reading the run's record");
  if (!loaded->has_value()) return absl::OkStatus();
  RunRecord& r = **loaded;
  const bool resume = !Terminal(r.state) && !r.stop_requested;
  absl::StatusOr<LoopConfig> loop = LoopConfigFromRun(r.config, data_root_);
  {
    absl::MutexLock lock(&mu_);
    run_id_ = r.run_id;
    used_ids_.insert(r.run_id);
    config_ = r.config;
    state_ = r.state;
    progress_ = r.progress;
    last_exact_ = r.last_exact;
    started_ = absl::FromUnixMillis(r.started_unix_ms);
    error_ = r.error;
    run_dir_ = r.run_dir;
    checkpoint_path_ = r.progress.last_checkpoint;
    resumes_ = r.resumes;
    stop_requested_ = r.stop_requested;
    if (!Terminal(r.state) && r.stop_requested) {
      state_ = v1::RUN_STATE_STOPPED;  // (it was stopping when the controller died)
    } else if (resume && !loop.ok()) {
      state_ = v1::RUN_STATE_FAILED;
      error_ = absl::StrCat("cannot resume: ", loop.status().ToString());
    } else if (resume) {
      state_ = v1::RUN_STATE_STARTING;
      ++resumes_;
    }
  }
  Persist();
  if (!resume || !loop.ok()) {
    if (log_ && !Terminal(r.state))
      log_(absl::StrCat("run ", r.run_id, " was active; it is now ", v1::RunState_Name(r.state)));
    return absl::OkStatus();
  }
  loop->run_id = r.run_id;
  loop->resume = r.progress;
  if (log_)
    log_(absl::StrCat("run ", r.run_id, " resumes after step ", r.progress.step, " (policy v",
                      r.progress.published_version, "); waiting for its peers"));
  stop_ = false;
  thread_ = std::thread([this, l = *loop, peers_within, replicas = r.config.rollout_replicas()]() mutable {
    const absl::Time deadline = absl::Now() + peers_within;
    absl::StatusOr<RunPeers> peers = absl::UnavailableError("not tried");
    while (!stop_.load()) {
      peers = peers_();
      if (peers.ok() && peers->rollouts.size() < std::max<size_t>(1, replicas)) {
        peers = absl::FailedPreconditionError(
            absl::StrCat("config.rollout_replicas: ", replicas, " wanted, ", peers->rollouts.size(), " known"));
      }
      if (peers.ok() || absl::Now() >= deadline) break;
      absl::SleepFor(absl::Seconds(1));
    }
    if (shutting_down_.load()) return;  // (still active in the store: the next controller resumes it)
    if (!peers.ok() || stop_.load()) {
      std::string line;
      {
        absl::MutexLock lock(&mu_);
        if (stop_requested_) {
          state_ = v1::RUN_STATE_STOPPED;  // (StopRun while it waited)
        } else {
          state_ = v1::RUN_STATE_FAILED;
          error_ = absl::StrCat("resuming: the run's peers: ", peers.status().ToString());
        }
        line = absl::StrCat("run ", run_id_, " ", v1::RunState_Name(state_), " before it resumed: ", error_);
      }
      Persist();
      if (log_) log_(line);
      return;
    }
    Body(std::move(l), std::move(*peers));
  });
  return absl::OkStatus();
}

RunManager::~RunManager() {
  shutting_down_ = true;
  stop_ = true;
  absl::MutexLock starting(&start_mu_);
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::string> RunManager::Start(const v1::RunConfig& config, const std::string& run_id) {
  // The id names a folder (runs_dir/<id>) and goes to the buffer: one path component
  // of a fixed alphabet, checked before anything else.
  if (!run_id.empty()) RETURN_IF_ERROR(common::ValidatePathId("run_id", run_id));
  absl::StatusOr<LoopConfig> loop = LoopConfigFromRun(config, data_root_);
  if (!loop.ok()) return loop.status();
  absl::MutexLock starting(&start_mu_);  // (a concurrent Start waits here, then finds this run active)
  {
    absl::MutexLock lock(&mu_);
    if (!Terminal(state_)) {
      return absl::FailedPreconditionError(absl::StrCat("run ", run_id_, " is active; StopRun it first"));
    }
    if (!run_id.empty() && used_ids_.contains(run_id)) {
      return absl::AlreadyExistsError(absl::StrCat("run_id: ", run_id, " was used before"));
    }
  }
  if (!run_id.empty() && !runs_dir_.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::path(runs_dir_) / run_id, ec)) {
      return absl::AlreadyExistsError(
          absl::StrCat("run_id: ", run_id, " was used before (", runs_dir_, "/", run_id, " exists)"));
    }
  }
  absl::StatusOr<RunPeers> peers = peers_();
  if (!peers.ok()) return peers.status();
  if (config.rollout_replicas() > peers->rollouts.size()) {
    return absl::FailedPreconditionError(absl::StrCat("config.rollout_replicas: ", config.rollout_replicas(),
                                                      " wanted, ", peers->rollouts.size(),
                                                      " known (scale the rollout role up first)"));
  }
  if (thread_.joinable()) thread_.join();  // the previous run's thread has finished
  const std::string id = run_id.empty() ? common::NewId("run") : run_id;
  loop->run_id = id;
  {
    absl::MutexLock lock(&mu_);
    used_ids_.insert(id);
    run_id_ = id;
    state_ = v1::RUN_STATE_STARTING;
    config_ = config;
    progress_ = LoopProgress();
    last_exact_ = 0;
    started_ = absl::Now();
    error_.clear();
    run_dir_ = runs_dir_.empty() ? "" : (std::filesystem::path(runs_dir_) / id).string();
    stop_requested_ = false;
    stop_checkpoint_ = false;
    stop_timed_out_ = false;
    checkpoint_path_.clear();
    resumes_ = 0;
  }
  stop_ = false;
  Persist();
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

bool RunManager::HasActiveRun() {
  absl::MutexLock lock(&pool_mu_);
  return pool_ != nullptr;
}

std::optional<LoopProgress> RunManager::ActiveProgress() {
  if (!HasActiveRun()) return std::nullopt;
  absl::MutexLock lock(&mu_);
  if (state_ != v1::RUN_STATE_RUNNING || progress_.step == 0) return std::nullopt;
  return progress_;
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
      absl::Status opened = metrics.Open(dir, /*append=*/config.resume.has_value());
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
    Persist();
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
  if (shutting_down_.load()) {
    // The controller is stopping (not the run): its record stays as of its last step,
    // active, and the next controller resumes it.
    bool asked_to_stop = false;
    {
      absl::MutexLock lock(&mu_);
      asked_to_stop = stop_requested_;
    }
    if (!asked_to_stop) {
      if (log_) log_(absl::StrCat("run ", config.run_id, " left active for the next controller to resume"));
      return;
    }
  }
  // StopRun with checkpoint: the trainer's state after the last step, unless the loop
  // saved that step already.
  bool checkpoint = false;
  int step = 0;
  std::string saved;
  {
    absl::MutexLock lock(&mu_);
    checkpoint = s.ok() && stop_requested_ && stop_checkpoint_;
    step = progress_.step;
    saved = progress_.last_checkpoint;
  }
  const std::string last_name = absl::StrCat(config.run_id, "-step-", step);
  if (checkpoint && !(absl::EndsWith(saved, "/" + last_name) || saved == last_name)) {
    absl::StatusOr<std::string> path = SaveStepCheckpoint(*peers.trainer, config, stop_, config.run_id, step);
    if (path.ok()) {
      saved = *path;
    } else {
      s = common::Annotate(path.status(), "checkpoint at StopRun");
    }
  }
  std::string line;
  {
    absl::MutexLock lock(&mu_);
    checkpoint_path_ = saved;
    if (!s.ok()) {
      state_ = v1::RUN_STATE_FAILED;
      error_ = s.ToString();
    } else if (stop_timed_out_) {
      state_ = v1::RUN_STATE_FAILED;
      error_ = "StopRun: the run did not stop within its grace period";
    } else {
      state_ = stop_requested_ ? v1::RUN_STATE_STOPPED : v1::RUN_STATE_COMPLETED;
    }
    line = absl::StrCat("run ", run_id_, " ", v1::RunState_Name(state_), " after ", progress_.step, " steps",
                        s.ok() ? "" : ": " + error_);
  }
  Persist();
  if (log_) log_(line);
  if (write_metrics && log_) log_(metrics.Finish());
}

absl::Status RunManager::Stop(const std::string& run_id, bool checkpoint, absl::Duration grace,
                              v1::StopRunResponse* response) {
  {
    absl::MutexLock lock(&mu_);
    if (!run_id.empty() && run_id != run_id_) {
      return absl::NotFoundError(absl::StrCat("run_id: no run ", run_id, " (current: ", run_id_, ")"));
    }
    if (checkpoint && !Terminal(state_) && config_.checkpoint_dir().empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint: run ", run_id_, " has no config.checkpoint_dir to save a checkpoint into"));
    }
    if (checkpoint && Terminal(state_) && state_ != v1::RUN_STATE_IDLE && checkpoint_path_.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint: run ", run_id_, " already ended (",
                                                        v1::RunState_Name(state_), ") without a checkpoint"));
    }
    if (!Terminal(state_)) {
      stop_requested_ = true;
      stop_checkpoint_ = stop_checkpoint_ || checkpoint;
      state_ = v1::RUN_STATE_STOPPING;
    }
  }
  stop_ = true;
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return Terminal(state_); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), grace)) {
    // It ends FAILED when it does stop (the contract: a run that overruns its grace
    // period is failed).
    stop_timed_out_ = true;
    return absl::DeadlineExceededError(
        absl::StrCat("run ", run_id_, " did not stop within ", absl::FormatDuration(grace), "; it is marked FAILED"));
  }
  response->set_state(state_);
  response->set_step(progress_.step);
  response->set_checkpoint_path(checkpoint_path_);
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
  response->set_resumes(static_cast<uint32_t>(resumes_));
  v1::MetricsSummary* m = response->mutable_metrics();
  m->set_reward_mean(static_cast<float>(progress_.train_reward));
  m->set_eval_exact_match(last_exact_);
  m->set_elapsed_ms(absl::ToDoubleMilliseconds(absl::Now() - started_));
  m->set_rollout_tokens_per_s(progress_.tokens_per_s);
  m->set_train_step_ms(progress_.train_seconds * 1e3);
  m->set_weight_sync_ms(progress_.sync_seconds * 1e3);
  m->set_mean_staleness(progress_.mean_staleness);
  m->set_loss(progress_.loss);
  m->set_experiences_accepted(progress_.accepted_experiences);
  m->set_trained_sequences(progress_.trained_sequences);
  m->set_idle_steps(static_cast<uint32_t>(progress_.idle_steps));
  m->set_failed_checkpoints(static_cast<uint32_t>(progress_.failed_checkpoints));
  if (progress_.policy_version > response->policy_version().version()) {
    response->mutable_policy_version()->set_version(progress_.policy_version);
  }
}

}  // namespace rlfleet::controller

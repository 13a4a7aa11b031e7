#include "services/rollout/rollout_core.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <set>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "libs/common/checks.h"
#include "libs/common/files.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"
#include "libs/model/hf_model.h"
#include "services/rollout/rollout_requests.h"

namespace rlfleet::rollout {

// A request's samples. Fields marked (mu_) are guarded by the core's mu_; the rest
// belong to the scheduler thread once the job is queued.
class RolloutCore::Job {
 public:
  struct Sample {
    uint32_t tokens = 0;
    absl::Time first_token = absl::InfinitePast(), last_token = absl::InfinitePast();
    bool finished = false;
  };

  std::vector<std::vector<int32_t>> prompts;  // one per sample
  model::SamplingOptions options;
  uint64_t base_seed = 0;
  absl::Time arrival, deadline;
  JobSink sink;
  size_t next_sample = 0;         // (mu_) first sample not yet in the batch
  uint64_t queued_at_step = 0;    // (mu_) the scheduler's step count when it was queued
  bool cancel_requested = false;  // (mu_)
  absl::Status cancel_status;     // (mu_) why, when cancel_requested
  std::vector<Sample> samples;
  int unfinished = 0;
  bool done = false;
  // The sink is told once, when the job ends, with every token (GenerateBatch: no one
  // reads a batch's tokens before it ends); `collected` gathers them meanwhile. Else
  // after every step that touched the job (Generate's stream).
  bool whole = false;
  JobEvents collected;
};

struct RolloutCore::Install {
  std::string path;                                  // the file, or what `bytes` are (errors)
  common::HostBuffer bytes;                          // a safetensors image in memory
  std::map<std::string, model::TensorView> tensors;  // or, if not empty, these
  std::optional<model::DeviceImage::Ref> device;     // or, if set, another process's GPU copy
  bool verify = false;                               // (device) its digest checked too
  uint64_t version = 0;
  absl::Notification done;
  absl::Status status;
  InstallReport report;
};

namespace {

constexpr int64_t kMaxGraceMs = int64_t{24} * 3600 * 1000;

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// `body`'s result, or INTERNAL naming `what` and the cause when it throws (libtorch
// throws c10::Error): on the scheduler thread an exception would end the replica.
template <typename Body>
auto Guarded(absl::string_view what, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, " failed: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, " failed: an unknown exception"));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<RolloutCore>> RolloutCore::Create(const model::PolicyConfig& config,
                                                                 const std::string& device, RolloutLimits limits) {
  ASSIGN_OR_RETURN(auto policy, model::Policy::Create(config, device));
  std::unique_ptr<RolloutCore> core(new RolloutCore(std::move(policy), device, limits));
  try {
    core->scheduler_ = std::thread([c = core.get()] { c->Run(); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("no thread for the rollout scheduler: ", e.what()));
  }
  return core;
}

RolloutCore::RolloutCore(std::unique_ptr<model::Policy> policy, std::string device, RolloutLimits limits)
    : device_(std::move(device)),
      limits_(limits),
      config_(policy->config()),
      num_parameters_(policy->num_parameters()),
      parameter_names_(policy->ParameterNames()),
      policy_(std::move(policy)),
      queued_("rlfleet_rollout_queued_sequences", "Sequences waiting to join the batch."),
      active_("rlfleet_rollout_active_sequences", "Sequences in the running decode batch."),
      tokens_metric_(metrics::Global().AddCounter("rlfleet_rollout_tokens_total",
                                                  "Response tokens decoded (and prefilled first tokens).", {})),
      step_metric_(metrics::Global().AddHistogram("rlfleet_rollout_decode_step_seconds",
                                                  "Time of one decode step of the whole batch.", {})),
      swap_metric_(metrics::Global().AddHistogram("rlfleet_weight_install_pause_seconds",
                                                  "Decode paused for a weight install (load + KV recompute).",
                                                  {{"service", "rollout"}})),
      load_metric_(metrics::Global().AddHistogram("rlfleet_weight_load_seconds",
                                                  "Weight sync: reading and verifying a version on the replica.", {})),
      load_bytes_metric_(metrics::Global().AddCounter("rlfleet_weight_load_bytes_total",
                                                      "Weight sync: bytes of the versions the replica loaded.", {})),
      version_metric_(
          metrics::Global().AddGauge("rlfleet_policy_version", "Installed policy version.", {{"service", "rollout"}})) {
  // (Gauges the scheduler sets, not callbacks: the registry outlives this core.)
  batch_ = std::make_unique<model::DecodeBatch>(policy_.get(), limits_.max_batch);
  // (the scheduler thread is started by Create)
}

RolloutCore::~RolloutCore() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (scheduler_.joinable()) scheduler_.join();
}

absl::StatusOr<InstallReport> RolloutCore::InstallFromFile(const std::string& path, uint64_t version,
                                                           absl::Time deadline) {
  // Read here, on the caller's thread, never on the scheduler's: a regular file of at
  // most this model's size (a FIFO or /dev/zero is refused, not waited on).
  ASSIGN_OR_RETURN(
      std::string bytes,
      common::ReadRegularFile("weights file", path, model::F32ImageBytesBound(static_cast<uint64_t>(num_parameters_))));
  return InstallFromBytes(common::HostBuffer(std::move(bytes)), path, version, deadline);
}

absl::StatusOr<InstallReport> RolloutCore::InstallFromModelDir(const std::string& dir, uint64_t version,
                                                               absl::Time deadline) {
  ASSIGN_OR_RETURN(model::HfWeights weights, model::ReadHfWeights(dir, parameter_names_, config_));
  return InstallFromTensors(std::move(weights.tensors), dir, version, deadline);  // (the files outlive it)
}

absl::StatusOr<InstallReport> RolloutCore::InstallFromBytes(common::HostBuffer bytes, const std::string& name,
                                                            uint64_t version, absl::Time deadline,
                                                            common::HostBuffer* image_back) {
  auto install = std::make_shared<Install>();
  install->path = name;
  install->bytes = std::move(bytes);
  install->version = version;
  absl::StatusOr<InstallReport> report = Queue(install, deadline);
  // (Once Queue returned the scheduler is done with the install's bytes.)
  if (report.ok() && image_back != nullptr) *image_back = std::move(install->bytes);
  return report;
}

absl::StatusOr<InstallReport> RolloutCore::InstallFromTensors(std::map<std::string, model::TensorView> tensors,
                                                              const std::string& name, uint64_t version,
                                                              absl::Time deadline) {
  if (tensors.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": no tensors"));
  auto install = std::make_shared<Install>();
  install->path = name;
  install->tensors = std::move(tensors);
  install->version = version;
  return Queue(std::move(install), deadline);
}

absl::StatusOr<InstallReport> RolloutCore::InstallFromDevice(const model::DeviceImage::Ref& image, uint64_t version,
                                                             bool verify, absl::Time deadline) {
  auto install = std::make_shared<Install>();
  install->path = absl::StrCat("version ", version, " (GPU copy on ", image.pci_bus_id, ")");
  install->device = image;
  install->verify = verify;
  install->version = version;
  return Queue(std::move(install), deadline);
}

absl::StatusOr<InstallReport> RolloutCore::Queue(std::shared_ptr<Install> install, absl::Time deadline) {
  const uint64_t version = install->version;
  {
    absl::MutexLock lock(&mu_);
    if (version <= version_) {
      return absl::FailedPreconditionError(
          absl::StrCat("version ", version, " is not newer than the installed ", version_));
    }
    if (install_ != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("version ", install_->version, " is being installed; retry after it"));
    }
    install_ = install;
  }
  if (!install->done.WaitForNotificationWithDeadline(deadline)) {
    absl::MutexLock lock(&mu_);
    if (install_ == install) {  // the scheduler has not taken it: withdraw
      install_.reset();
      return absl::DeadlineExceededError(
          absl::StrCat("no decode-step boundary to install version ", version, " before the deadline"));
    }
  }
  install->done.WaitForNotification();  // taken: finishes with the load
  RETURN_IF_ERROR(install->status);
  return install->report;
}

absl::Status RolloutCore::InstallInitial(uint64_t version) {
  absl::MutexLock lock(&mu_);
  if (version <= version_) {
    return absl::FailedPreconditionError(
        absl::StrCat("version ", version, " is not newer than the installed ", version_));
  }
  version_ = version;
  return absl::OkStatus();
}

uint64_t RolloutCore::installed_version() {
  absl::MutexLock lock(&mu_);
  return version_;
}

bool RolloutCore::serving() {
  absl::MutexLock lock(&mu_);
  return version_ > 0 && !drained_ && !draining_;
}

absl::StatusOr<std::shared_ptr<RolloutCore::Job>> RolloutCore::Submit(std::vector<std::vector<int32_t>> prompts,
                                                                      const v1::SamplingParams& sampling,
                                                                      uint64_t min_policy_version, absl::Time deadline,
                                                                      JobSink sink, bool whole) {
  auto job = std::make_shared<Job>();
  job->whole = whole;
  uint64_t seed = 0;
  ASSIGN_OR_RETURN(job->options, ToOptions(sampling, limits_, config_, &seed));
  job->base_seed = seed;
  job->prompts = std::move(prompts);
  job->samples.resize(job->prompts.size());
  job->unfinished = job->prompts.size();
  job->arrival = absl::Now();
  job->deadline = deadline;
  job->sink = std::move(sink);
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("replica is shutting down");
  if (drained_ || draining_) return absl::UnavailableError("replica is drained: no new work until Resume");
  if (version_ == 0) return absl::FailedPreconditionError("no weight version installed yet");
  if (min_policy_version > version_) {
    return absl::FailedPreconditionError(
        absl::StrCat("installed version ", version_, " is below min_policy_version ", min_policy_version));
  }
  const int n = job->prompts.size();
  if (queued_.value() + n > limits_.max_queued) {
    return absl::ResourceExhaustedError(absl::StrCat(queued_.value(), " sequences are queued; ", n,
                                                     " more would pass the limit of ", limits_.max_queued,
                                                     ": retry later or on another replica"));
  }
  const int generate_limit = limits_.max_queued_generate > 0 ? limits_.max_queued_generate : limits_.max_queued / 2;
  if (!whole && queued_generate_ + n > generate_limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        queued_generate_, " inference sequences are queued; ", n, " more would pass their limit of ", generate_limit,
        " (the rest of the queue is kept for training): retry later or on another replica"));
  }
  queued_.Add(n);
  if (!whole) queued_generate_ += n;
  job->queued_at_step = steps_;
  waiting_.push_back(job);
  jobs_[job.get()] = job;
  return job;
}

void RolloutCore::Cancel(const std::shared_ptr<Job>& job) {
  absl::MutexLock lock(&mu_);
  if (job->cancel_requested || jobs_.count(job.get()) == 0) return;
  job->cancel_requested = true;
  job->cancel_status = absl::CancelledError("cancelled by the client");
  cancelled_.push_back(job);
}

bool RolloutCore::JoinNowLocked() const {
  const int live = batch_->size(), capacity = batch_->capacity();
  if (live == 0 || 2 * live < capacity) return true;
  const int group = limits_.join_group > 0 ? limits_.join_group : std::max(1, limits_.max_batch / 8);
  if (queued_.value() >= std::min(group, capacity - live)) return true;
  return steps_ - waiting_.front()->queued_at_step >= static_cast<uint64_t>(std::max(0, limits_.join_wait_steps));
}

void RolloutCore::Run() {
  for (;;) {
    std::shared_ptr<Install> install;
    std::vector<std::shared_ptr<Job>> cancelled;
    std::vector<model::DecodeBatch::Sequence> group;
    std::vector<std::pair<std::shared_ptr<Job>, uint32_t>> owners;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || install_ != nullptr || !cancelled_.empty() || !waiting_.empty() || batch_->size() > 0;
      };
      mu_.AwaitWithTimeout(absl::Condition(&has_work), absl::Milliseconds(100));
      if (stop_) break;
      install.swap(install_);
      cancelled.swap(cancelled_);
      const absl::Time now = absl::Now();
      for (auto& [ptr, job] : jobs_) {
        if (!job->cancel_requested && now > job->deadline) {
          job->cancel_requested = true;
          job->cancel_status = absl::DeadlineExceededError("deadline passed before every sample finished");
          cancelled.push_back(job);
        }
      }
      // Admit queued sequences in FIFO order while they fit (after a pending install,
      // so they start on the new version); into a running batch, a group at a time
      // (RolloutLimits::join_group).
      const bool join = !waiting_.empty() && JoinNowLocked();
      while (install == nullptr && join && !waiting_.empty()) {
        std::shared_ptr<Job> job = waiting_.front();
        if (job->cancel_requested) {  // (Abort, below, finds nothing left to retire)
          LeaveQueueLocked(job.get(), job->prompts.size());
          waiting_.pop_front();
          continue;
        }
        const uint32_t sample = job->next_sample;
        model::DecodeBatch::Sequence s;
        s.id = next_sequence_id_;
        s.prompt = job->prompts[sample];
        s.options = job->options;
        s.options.seed = model::SequenceSeed(job->base_seed, sample);
        group.push_back(std::move(s));
        if (!batch_->CanAdd(group)) {
          group.pop_back();
          break;
        }
        owners.emplace_back(job, sample);
        ++next_sequence_id_;
        LeaveQueueLocked(job.get(), sample + 1);
        if (job->next_sample == job->prompts.size()) waiting_.pop_front();
      }
    }
    if (install != nullptr) {
      const absl::Time start = absl::Now();
      // (never a file here: InstallFromFile read it on the caller's thread)
      install->status = Guarded("loading the weights", [&] {
        if (install->device) {
          install->report.from_device = true;
          return common::Annotate(
              policy_->InstallDeviceImage(*install->device, install->verify, &install->report.device), install->path);
        }
        return !install->tensors.empty() ? policy_->LoadTensors(install->tensors, install->path)
                                         : policy_->LoadSafetensorsBytes(install->bytes.str(), install->path);
      });
      const absl::Time loaded = absl::Now();
      if (!install->status.ok() && install->report.device.weights_changed) {
        absl::MutexLock lock(&mu_);
        version_ = 0;  // (a mix of two versions: nothing is served as either)
      }
      if (install->status.ok())
        install->status = Guarded("recomputing the KV cache", [&] { return batch_->Refresh(); });
      if (install->status.ok()) {
        absl::MutexLock lock(&mu_);
        version_ = install->version;
        ++swaps_;
        install->report.version = version_;
        install->report.decode_step = steps_;
      }
      install->report.inflight_sequences = batch_->size();
      install->report.install_us = absl::ToInt64Microseconds(loaded - start);
      install->report.pause_us = absl::ToInt64Microseconds(absl::Now() - start);
      swap_metric_->Observe(install->report.pause_us / 1e6);
      if (install->status.ok()) {
        // Weight sync, phase 2: reading and verifying the version (GB/s = the rate of
        // the bytes counter over the rate of the seconds sum).
        load_metric_->Observe(install->report.install_us / 1e6);
        uint64_t bytes = install->bytes.size() + install->report.device.bytes;
        for (const auto& [name, t] : install->tensors) bytes += t.bytes.size();
        load_bytes_metric_->Add(static_cast<double>(bytes));
      }
      install->done.Notify();
    }
    for (const auto& job : cancelled) {
      absl::Status why;
      {
        absl::MutexLock lock(&mu_);
        why = job->cancel_status;
      }
      Abort(job, v1::FINISH_REASON_ABORTED, why);
    }
    const absl::Time work_start = absl::Now();
    const bool prefills = !group.empty();
    if (prefills) {
      for (size_t i = 0; i < group.size(); ++i) live_[group[i].id] = owners[i];
      absl::StatusOr<std::vector<model::DecodeBatch::Token>> first = Guarded(
          "prefilling new sequences",
          [&]() -> absl::StatusOr<std::vector<model::DecodeBatch::Token>> { return batch_->Add(std::move(group)); });
      if (first.ok()) {
        Dispatch(*first);
      } else {
        for (auto& [job, sample] : owners) Abort(job, v1::FINISH_REASON_ERROR, first.status());
      }
    }
    const bool had_batch = batch_->size() > 0;
    if (had_batch) {
      const absl::Time step_start = absl::Now();
      absl::StatusOr<std::vector<model::DecodeBatch::Token>> step =
          Guarded("a decode step", [&]() -> absl::StatusOr<std::vector<model::DecodeBatch::Token>> {
            if (fault_hook_) fault_hook_();
            return batch_->Step();
          });
      step_metric_->Observe(absl::ToDoubleSeconds(absl::Now() - step_start));
      if (step.ok()) {
        {
          absl::MutexLock lock(&mu_);
          ++steps_;
        }
        Dispatch(*step);
      } else {
        std::set<Job*> seen;
        std::vector<std::shared_ptr<Job>> failing;
        for (auto& [id, owner] : live_) {
          if (seen.insert(owner.first.get()).second) failing.push_back(owner.first);
        }
        for (const auto& job : failing) Abort(job, v1::FINISH_REASON_ERROR, step.status());
      }
    }
    absl::MutexLock lock(&mu_);
    if (prefills || had_batch) busy_seconds_ += absl::ToDoubleSeconds(absl::Now() - work_start);
    active_.Set(batch_->size());
    version_metric_->Set(version_);
  }
  // Stopping: everything unfinished is aborted.
  std::vector<std::shared_ptr<Job>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [ptr, job] : jobs_) all.push_back(job);
    if (install_ != nullptr) {
      install_->status = absl::UnavailableError("replica is shutting down");
      install_->done.Notify();
      install_.reset();
    }
  }
  for (const auto& job : all) Abort(job, v1::FINISH_REASON_ABORTED, absl::UnavailableError("replica is shutting down"));
}

void RolloutCore::Dispatch(const std::vector<model::DecodeBatch::Token>& tokens) {
  uint64_t version;
  {
    absl::MutexLock lock(&mu_);
    version = version_;
  }
  const absl::Time now = absl::Now();
  absl::flat_hash_map<Job*, JobEvents> events;
  std::vector<std::shared_ptr<Job>> touched;  // (a whole job only in the step it ends)
  for (const model::DecodeBatch::Token& t : tokens) {
    auto it = live_.find(t.id);
    if (it == live_.end()) continue;
    Job* const job = it->second.first.get();
    const uint32_t sample = it->second.second;
    Job::Sample& s = job->samples[sample];
    if (s.tokens++ == 0) s.first_token = now;
    s.last_token = now;
    JobEvents* e = &job->collected;
    if (!job->whole) {
      auto [slot, first] = events.try_emplace(job);
      if (first) touched.push_back(it->second.first);
      e = &slot->second;
    }
    e->tokens.push_back({sample, t.token, t.logprob, version});
    if (t.finished) {
      s.finished = true;
      --job->unfinished;
      e->finished.push_back({sample, t.stopped_by_eos ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH, s.tokens,
                             Ms(s.first_token - job->arrival), Ms(s.last_token - s.first_token)});
      if (job->whole && job->unfinished == 0) touched.push_back(it->second.first);
      live_.erase(it);
    }
  }
  tokens_metric_->Add(tokens.size());
  {
    absl::MutexLock lock(&mu_);
    window_tokens_ += tokens.size();
    if (now - window_start_ >= absl::Seconds(1)) {
      tokens_per_s_ = window_tokens_ / absl::ToDoubleSeconds(now - window_start_);
      window_tokens_ = 0;
      window_start_ = now;
    }
  }
  auto events_of = [&](const std::shared_ptr<Job>& job) -> JobEvents& {
    return job->whole ? job->collected : events[job.get()];
  };
  for (const auto& job : touched) FinishJobIfDone(job, &events_of(job));
  for (const auto& job : touched) job->sink(std::move(events_of(job)));
}

void RolloutCore::LeaveQueueLocked(Job* job, size_t next) {
  if (next <= job->next_sample) return;  // (already retired: a cancel seen by the admission loop, then Abort)
  queued_.Remove(next - job->next_sample);
  if (!job->whole) queued_generate_ -= static_cast<int>(next - job->next_sample);
  job->next_sample = next;
}

void RolloutCore::FinishJobIfDone(const std::shared_ptr<Job>& job, JobEvents* events) {
  if (job->unfinished > 0 || job->done) return;
  job->done = true;
  events->done = true;
  absl::MutexLock lock(&mu_);
  finished_sequences_ += job->samples.size();
  jobs_.erase(job.get());
}

void RolloutCore::Abort(const std::shared_ptr<Job>& job, v1::FinishReason reason, const absl::Status& status) {
  if (job->done) return;
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->second.first == job) {
      batch_->Remove(it->first);
      live_.erase(it++);
    } else {
      ++it;
    }
  }
  JobEvents e = job->whole ? std::move(job->collected) : JobEvents();  // (a whole job: with its tokens so far)
  const absl::Time now = absl::Now();
  uint64_t aborted = 0, finished = 0;
  for (uint32_t i = 0; i < job->samples.size(); ++i) {
    Job::Sample& s = job->samples[i];
    if (s.finished) {
      ++finished;
      continue;
    }
    s.finished = true;
    ++aborted;
    e.finished.push_back(
        {i, reason, s.tokens, s.tokens ? Ms(s.first_token - job->arrival) : 0, s.tokens ? Ms(now - s.first_token) : 0});
  }
  job->unfinished = 0;
  job->done = true;
  e.done = true;
  e.status = status;
  {
    absl::MutexLock lock(&mu_);
    if (job->next_sample < job->prompts.size()) {
      LeaveQueueLocked(job.get(), job->prompts.size());
      waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), job), waiting_.end());
    }
    aborted_sequences_ += aborted;
    finished_sequences_ += finished;
    jobs_.erase(job.get());
    active_.Set(batch_->size());
  }
  job->sink(std::move(e));
}

absl::StatusOr<std::shared_ptr<RolloutCore::Job>> RolloutCore::Generate(const v1::GenerateRequest& request,
                                                                        StreamSink sink, absl::Time deadline) {
  RETURN_IF_ERROR(common::ValidateId("request_id", request.request_id()));
  ASSIGN_OR_RETURN(const int samples, Samples(request.num_samples(), limits_.max_samples));
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>("chunk_tokens", request.chunk_tokens(), 0, 1024));
  RETURN_IF_ERROR(CheckCopied("prompt_id", request.prompt_id()));
  RETURN_IF_ERROR(CheckCopied("group_id", request.group_id()));
  RETURN_IF_ERROR(CheckCopied("task", request.task()));
  uint64_t unused_seed = 0;
  ASSIGN_OR_RETURN(const model::SamplingOptions options, ToOptions(request.sampling(), limits_, config_, &unused_seed));
  RETURN_IF_ERROR(CheckPrompt(request.prompt_token_ids(), "prompt_token_ids", options.max_new_tokens, config_));
  std::vector<int32_t> prompt(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  // Tokens are sent in chunks of chunk_tokens per sample, and what is left when a
  // sample finishes; then its SampleFinished.
  struct Chunker {
    std::string request_id;
    size_t chunk = 16;
    std::vector<v1::TokenChunk> pending;
    StreamSink sink;
  };
  auto chunker = std::make_shared<Chunker>();
  chunker->request_id = request.request_id();
  chunker->chunk = request.chunk_tokens() == 0 ? 16 : request.chunk_tokens();
  chunker->pending.resize(samples);
  for (int i = 0; i < samples; ++i) chunker->pending[i].set_sample_index(i);
  chunker->sink = std::move(sink);
  JobSink job_sink = [chunker](JobEvents e) {
    std::vector<v1::GenerateResponse> out;
    auto flush = [&](uint32_t sample) {
      v1::TokenChunk& c = chunker->pending[sample];
      if (c.token_ids_size() == 0) return;
      *out.emplace_back().mutable_chunk() = c;
      c.set_token_offset(c.token_offset() + c.token_ids_size());
      c.clear_token_ids();
      c.clear_logprobs();
      c.clear_policy_versions();
    };
    for (const JobEvents::Token& t : e.tokens) {
      v1::TokenChunk& c = chunker->pending[t.sample];
      c.add_token_ids(t.token);
      c.add_logprobs(t.logprob);
      c.add_policy_versions(t.version);
      if (static_cast<size_t>(c.token_ids_size()) >= chunker->chunk) flush(t.sample);
    }
    for (const JobEvents::Finished& f : e.finished) {
      flush(f.sample);
      v1::SampleFinished* done = out.emplace_back().mutable_finished();
      done->set_sample_index(f.sample);
      done->set_finish_reason(f.reason);
      done->set_response_tokens(f.tokens);
      done->mutable_experience_id()->set_value(absl::StrCat(chunker->request_id, ":", f.sample));
      done->set_time_to_first_token_ms(f.time_to_first_token_ms);
      done->set_decode_ms(f.decode_ms);
    }
    chunker->sink(std::move(out), e.done, e.status);
  };
  return Submit(std::vector<std::vector<int32_t>>(samples, prompt), request.sampling(), request.min_policy_version(),
                deadline, std::move(job_sink));
}

absl::Status RolloutCore::GenerateBatch(const v1::GenerateBatchRequest& request, v1::GenerateBatchResponse* response,
                                        absl::Time deadline) {
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(common::ValidateId("request_id", request.request_id()));
  const int prompts = request.prompts_size();
  ASSIGN_OR_RETURN(const int samples, Samples(request.num_samples(), limits_.max_sequences));
  if (prompts < 1 || prompts > limits_.max_prompts) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompts has ", prompts, " entries; the limit is 1..", limits_.max_prompts));
  }
  if (static_cast<int64_t>(prompts) * samples > limits_.max_sequences) {
    return absl::InvalidArgumentError(absl::StrCat("prompts x num_samples = ", prompts * samples,
                                                   " exceeds the limit of ", limits_.max_sequences, " sequences"));
  }
  uint64_t unused_seed = 0;
  ASSIGN_OR_RETURN(const model::SamplingOptions options, ToOptions(request.sampling(), limits_, config_, &unused_seed));
  std::vector<std::vector<int32_t>> rows;
  for (int p = 0; p < prompts; ++p) {
    const v1::BatchPrompt& prompt = request.prompts(p);
    const auto& ids = prompt.prompt_token_ids();
    RETURN_IF_ERROR(CheckCopied(absl::StrCat("prompts[", p, "].prompt_id"), prompt.prompt_id()));
    RETURN_IF_ERROR(CheckCopied(absl::StrCat("prompts[", p, "].group_id"), prompt.group_id()));
    RETURN_IF_ERROR(CheckCopied(absl::StrCat("prompts[", p, "].task"), prompt.task()));
    RETURN_IF_ERROR(
        CheckPrompt(ids, absl::StrCat("prompts[", p, "].prompt_token_ids"), options.max_new_tokens, config_));
    for (int s = 0; s < samples; ++s) rows.emplace_back(ids.begin(), ids.end());
  }
  struct Result {
    absl::Mutex mu;
    std::vector<v1::Experience> rows;
    absl::Status status;
    absl::Notification done;
  };
  auto result = std::make_shared<Result>();
  result->rows.resize(rows.size());
  JobSink sink = [result](JobEvents e) {
    absl::MutexLock lock(&result->mu);
    for (const JobEvents::Token& t : e.tokens) {
      v1::Experience& x = result->rows[t.sample];
      x.add_response_token_ids(t.token);
      x.add_response_logprobs(t.logprob);
      x.add_token_policy_versions(t.version);
    }
    for (const JobEvents::Finished& f : e.finished) result->rows[f.sample].set_finish_reason(f.reason);
    if (e.done) {
      result->status = e.status;
      result->done.Notify();
    }
  };
  ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                   Submit(std::move(rows), request.sampling(), request.min_policy_version(), deadline, sink,
                          /*whole=*/true));
  // The scheduler aborts the job at its deadline; the margin covers one decode step.
  if (!result->done.WaitForNotificationWithDeadline(deadline + absl::Seconds(30))) {
    Cancel(job);
    return absl::DeadlineExceededError("GenerateBatch: the replica did not finish the batch in time");
  }
  absl::MutexLock lock(&result->mu);
  RETURN_IF_ERROR(result->status);
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  uint64_t tokens = 0;
  for (size_t r = 0; r < result->rows.size(); ++r) {
    const int p = static_cast<int>(r) / samples, s = static_cast<int>(r) % samples;
    const v1::BatchPrompt& prompt = request.prompts(p);
    v1::Experience* e = response->add_completions();
    *e = std::move(result->rows[r]);
    e->mutable_experience_id()->set_value(absl::StrCat(request.request_id(), ":", p, ":", s));
    e->set_prompt_id(prompt.prompt_id());
    e->set_group_id(prompt.group_id().empty() ? prompt.prompt_id() : prompt.group_id());
    e->set_task(prompt.task());
    *e->mutable_prompt_token_ids() = prompt.prompt_token_ids();
    e->set_created_at_unix_ms(now_ms);
    tokens += e->response_token_ids_size();
  }
  response->set_generated_tokens(tokens);
  response->set_elapsed_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status RolloutCore::GetInfo(v1::GetInfoResponse* response) {
  const model::PolicyConfig& c = config_;
  v1::ModelConfig* m = response->mutable_model();
  m->set_vocab_size(c.vocab_size);
  m->set_d_model(c.d_model);
  m->set_n_layers(c.n_layers);
  m->set_n_heads(c.n_heads);
  m->set_max_seq_len(c.max_seq_len);
  m->set_has_value_head(c.value_head);
  m->set_dtype(c.dtype == "bf16" ? v1::DTYPE_BFLOAT16 : c.dtype == "fp16" ? v1::DTYPE_FLOAT16 : v1::DTYPE_FLOAT32);
  m->set_num_parameters(num_parameters_);
  absl::MutexLock lock(&mu_);
  response->mutable_installed_version()->set_version(version_);
  if (install_ != nullptr) response->mutable_staged_version()->set_version(install_->version);
  response->set_state(drained_        ? v1::REPLICA_SERVING_STATE_DRAINED
                      : draining_     ? v1::REPLICA_SERVING_STATE_DRAINING
                      : version_ == 0 ? v1::REPLICA_SERVING_STATE_WAITING_FOR_WEIGHTS
                                      : v1::REPLICA_SERVING_STATE_SERVING);
  v1::LoadStats* load = response->mutable_load();
  if (const absl::Time now = absl::Now(); now - busy_since_ >= absl::Seconds(1)) {
    utilization_ = std::min(1.0, busy_seconds_ / absl::ToDoubleSeconds(now - busy_since_));
    busy_seconds_ = 0;
    busy_since_ = now;
  }
  load->set_utilization(utilization_);
  load->set_tokens_per_s(tokens_per_s_);
  load->set_active_sequences(active_.value());
  load->set_queued_requests(waiting_.size());
  load->set_inflight_requests(jobs_.size());
  response->set_device(device_);
  response->set_host_id(common::HostId());
  response->set_max_batch_sequences(limits_.max_batch);
  response->set_weight_swaps(swaps_);
  return absl::OkStatus();
}

absl::Status RolloutCore::Drain(const v1::DrainRequest& request, v1::DrainResponse* response) {
  RETURN_IF_ERROR(common::CheckInRange<int64_t>("grace_ms", request.grace_ms(), 0, kMaxGraceMs));
  absl::MutexLock lock(&mu_);
  const uint64_t finished0 = finished_sequences_, aborted0 = aborted_sequences_;
  if (!drained_) draining_ = true;
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return jobs_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Milliseconds(request.grace_ms()))) {
    for (auto& [ptr, job] : jobs_) {
      if (job->cancel_requested) continue;
      job->cancel_requested = true;
      job->cancel_status = absl::UnavailableError("replica drained: aborted at the grace deadline");
      cancelled_.push_back(job);
    }
    if (!mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(30))) {
      return absl::DeadlineExceededError("drain: in-flight work did not stop within 30 s of aborting it");
    }
  }
  draining_ = false;
  drained_ = true;
  response->set_finished_sequences(finished_sequences_ - finished0);
  response->set_aborted_sequences(aborted_sequences_ - aborted0);
  response->set_drained_at_unix_ms(absl::ToUnixMillis(absl::Now()));
  return absl::OkStatus();
}

absl::Status RolloutCore::Resume(v1::ResumeResponse* response) {
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::FailedPreconditionError("replica is shutting down");
  drained_ = false;
  draining_ = false;
  response->set_state(version_ == 0 ? v1::REPLICA_SERVING_STATE_WAITING_FOR_WEIGHTS
                                    : v1::REPLICA_SERVING_STATE_SERVING);
  return absl::OkStatus();
}

}  // namespace rlfleet::rollout

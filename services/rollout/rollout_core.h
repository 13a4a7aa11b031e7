// RolloutCore: a policy replica without gRPC, serving generation through a
// continuous-batching scheduler.
//
// One scheduler thread owns the model and a model::DecodeBatch. Requests (Generate:
// one prompt x N samples, streamed; GenerateBatch: many prompts, answered at once)
// queue as jobs; between decode steps the scheduler admits queued sequences in FIFO
// order while the batch has rows and cache room, decodes one token for every live
// sequence, and hands each job its tokens. A new weight version is installed at a
// step boundary while sequences are in flight (partial rollout): the KV cache is
// recomputed with the new weights and every token says which version decoded it.
//
// States: WAITING_FOR_WEIGHTS until a version is installed, then SERVING; Drain
// refuses new work (DRAINING), lets in-flight work finish until its grace time, aborts
// the rest (FINISH_REASON_ABORTED) and is DRAINED until Resume.
// A libtorch exception on the scheduler thread fails the requests it touched (INTERNAL
// naming the cause) and the scheduler keeps serving. Every request field is range-checked
// in its own type before any cast. Thread-safe.
#ifndef RLFLEET_SERVICES_ROLLOUT_ROLLOUT_CORE_H_
#define RLFLEET_SERVICES_ROLLOUT_ROLLOUT_CORE_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/host_buffer.h"
#include "libs/metrics/inflight_gauge.h"
#include "libs/metrics/metrics.h"
#include "libs/model/policy.h"
#include "libs/model/safetensors.h"
#include "rlfleet/v1/rollout.pb.h"

namespace rlfleet::rollout {

struct RolloutLimits {
  int max_prompts = 256;     // GenerateBatch prompts
  int max_sequences = 1024;  // GenerateBatch prompts x num_samples
  int max_new_tokens = 512;
  int max_batch = 256;    // sequences decoded together
  int max_queued = 4096;  // sequences waiting to join the batch (RESOURCE_EXHAUSTED beyond)
  // Of those, Generate's (inference: the gateway) at most this many, so that a flood of
  // inference never takes the queue from GenerateBatch (the run's rollouts), which may
  // use all of max_queued. 0: max_queued / 2.
  int max_queued_generate = 0;
  int max_samples = 64;  // Generate num_samples
  // While the batch is decoding, queued sequences join it in groups of at least this
  // many (or as many as there are free rows, if fewer), or once the oldest has waited
  // join_wait_steps decode steps: a joiner's prompt is prefilled in a forward pass of
  // its own, so under a steady trickle of requests one pass per few joiners instead of
  // one per joiner. 0: max_batch / 8. An idle batch (or one under half full) takes what
  // is queued at once.
  int join_group = 0;
  int join_wait_steps = 8;
  // The model's end-of-sequence tokens (a sequence ends on any; sampling.ignore_eos
  // turns them off): the built-in tokenizer's EOS, or what a model directory names
  // (hf_model.h ReadHfEosIds; none: sequences end at max_new_tokens or a stop id).
  std::vector<int32_t> eos_ids = {2};
};

// What a job's sink is told after each scheduler step that touched it. Called on the
// scheduler thread: it must not block (queue and return).
struct JobEvents {
  struct Token {
    uint32_t sample = 0;
    int32_t token = 0;
    float logprob = 0;
    uint64_t version = 0;  // the policy version that decoded it
  };
  struct Finished {
    uint32_t sample = 0;
    v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
    uint32_t tokens = 0;
    double time_to_first_token_ms = 0;
    double decode_ms = 0;
  };
  std::vector<Token> tokens;
  std::vector<Finished> finished;
  bool done = false;    // every sample finished; the last call for this job
  absl::Status status;  // with done: why unfinished samples were aborted, if any
};
using JobSink = std::function<void(JobEvents)>;

// Report of a weight install (CommitWeightsResponse's fields).
struct InstallReport {
  uint64_t version = 0;
  uint64_t decode_step = 0;           // the scheduler's step count when it took effect
  uint32_t inflight_sequences = 0;    // sequences that continue on the new version
  int64_t pause_us = 0;               // decode paused (load + KV recompute)
  int64_t install_us = 0;             // loading the weights into the model
  bool from_device = false;           // copied GPU to GPU from another process (InstallFromDevice)
  model::DeviceInstallReport device;  // (then) where its time went
};

class RolloutCore {
 public:
  class Job;

  // INVALID_ARGUMENT for a config that does not make a model; RESOURCE_EXHAUSTED when
  // no thread can be created for the scheduler.
  static absl::StatusOr<std::unique_ptr<RolloutCore>> Create(const model::PolicyConfig& config,
                                                             const std::string& device, RolloutLimits limits = {});
  ~RolloutCore();  // aborts what is in flight (UNAVAILABLE) and stops the scheduler

  // Installs weights from a safetensors file as `version` (> the installed one, else
  // FAILED_PRECONDITION) at the next decode-step boundary; in-flight sequences
  // continue on it. The file is read on the calling thread (a regular file of at most
  // the model's f32 image size). INVALID_ARGUMENT / NOT_FOUND from the file (nothing
  // changes);
  // DEADLINE_EXCEEDED if the scheduler did not take it before `deadline`.
  absl::StatusOr<InstallReport> InstallFromFile(const std::string& path, uint64_t version,
                                                absl::Time deadline = absl::InfiniteFuture());
  // The same from a safetensors image in memory (a version pulled from the weights
  // service); `name` names it in errors. The model copies what it needs, so with
  // `image_back` the image is handed back unchanged once installed (to serve it to
  // other replicas without a copy of its own).
  absl::StatusOr<InstallReport> InstallFromBytes(common::HostBuffer bytes, const std::string& name, uint64_t version,
                                                 absl::Time deadline = absl::InfiniteFuture(),
                                                 common::HostBuffer* image_back = nullptr);
  // The same from tensors where they already are (a version pushed into this replica's
  // shard memory, which must stay untouched until this returns); `name` names them.
  absl::StatusOr<InstallReport> InstallFromTensors(std::map<std::string, model::TensorView> tensors,
                                                   const std::string& name, uint64_t version,
                                                   absl::Time deadline = absl::InfiniteFuture());
  // The same from a Hugging Face model directory's weights (model.safetensors or its
  // shards; hf_model.h), read on the calling thread: a replica started on a checkpoint.
  absl::StatusOr<InstallReport> InstallFromModelDir(const std::string& dir, uint64_t version,
                                                    absl::Time deadline = absl::InfiniteFuture());
  // The same from another process's GPU memory on this host (a trainer's DeviceImage,
  // CUDA IPC): mapped, its digest checked and copied at the step boundary (one
  // device-to-device copy; policy.h InstallDeviceImage's errors).
  // With `verify` the image's digest is checked too. An error after the copy began
  // (the trainer rewrote the image meanwhile) leaves this replica with no version (0):
  // it serves nothing until another version is installed.
  absl::StatusOr<InstallReport> InstallFromDevice(const model::DeviceImage::Ref& image, uint64_t version, bool verify,
                                                  absl::Time deadline = absl::InfiniteFuture());
  // Installs the model's current (e.g. freshly initialised) weights as `version`.
  absl::Status InstallInitial(uint64_t version);

  // Streams `request`'s samples to `sink` as GenerateResponse messages (chunks of
  // chunk_tokens tokens per sample, SampleFinished per sample); `done` on the last
  // call, with the status the stream should end with. Errors before anything runs:
  // INVALID_ARGUMENT naming the field; FAILED_PRECONDITION (no weights, below
  // min_policy_version); UNAVAILABLE (drained); RESOURCE_EXHAUSTED (queue full).
  using StreamSink = std::function<void(std::vector<v1::GenerateResponse>, bool done, absl::Status)>;
  absl::StatusOr<std::shared_ptr<Job>> Generate(const v1::GenerateRequest& request, StreamSink sink,
                                                absl::Time deadline = absl::InfiniteFuture());
  // Aborts a job's unfinished samples (FINISH_REASON_ABORTED); its sink gets `done`.
  void Cancel(const std::shared_ptr<Job>& job);

  // Runs the batch through the scheduler and answers when every sequence finished;
  // errors as Generate, and DEADLINE_EXCEEDED at `deadline` (the sequences are aborted).
  absl::Status GenerateBatch(const v1::GenerateBatchRequest& request, v1::GenerateBatchResponse* response,
                             absl::Time deadline = absl::Now() + absl::Minutes(10));

  absl::Status GetInfo(v1::GetInfoResponse* response);
  // INVALID_ARGUMENT for grace_ms < 0.
  absl::Status Drain(const v1::DrainRequest& request, v1::DrainResponse* response);
  absl::Status Resume(v1::ResumeResponse* response);

  uint64_t installed_version();
  bool serving();
  // How decode steps run: "cuda graphs" or "eager" (model::Policy::DecodeMode).
  std::string decode_mode() const { return policy_->DecodeMode(); }

  // Test hook: called on the scheduler thread before every decode step (a hook that
  // throws is what a libtorch failure there looks like). Set before any work.
  void SetFaultHookForTest(std::function<void()> hook) { fault_hook_ = std::move(hook); }

 private:
  struct Install;
  absl::StatusOr<InstallReport> Queue(std::shared_ptr<Install> install, absl::Time deadline);
  RolloutCore(std::unique_ptr<model::Policy> policy, std::string device, RolloutLimits limits);

  // Validates and queues a job of `prompts` (one per sample). Errors as Generate.
  // `whole`: the sink is told once, when the job ends (Job::whole).
  absl::StatusOr<std::shared_ptr<Job>> Submit(std::vector<std::vector<int32_t>> prompts,
                                              const v1::SamplingParams& sampling, uint64_t min_policy_version,
                                              absl::Time deadline, JobSink sink, bool whole = false);
  void Run();  // the scheduler thread
  // Whether queued sequences join the batch at this step boundary (join_group).
  bool JoinNowLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Dispatch(const std::vector<model::DecodeBatch::Token>& tokens);
  void Abort(const std::shared_ptr<Job>& job, v1::FinishReason reason, const absl::Status& status);
  // The one place sequences leave the queue: `job`'s samples [next_sample, next) were
  // admitted to the batch or retired (cancel, client gone, deadline, drain, error,
  // shutdown), and next_sample moves to `next`. A sample leaves once whichever paths
  // retire its job (next_sample never moves back), so queued_ returns to exactly 0.
  void LeaveQueueLocked(Job* job, size_t next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `job` done (and `events`, what its sink is told next) when no sample is left.
  void FinishJobIfDone(const std::shared_ptr<Job>& job, JobEvents* events);

  const std::string device_;
  const RolloutLimits limits_;
  const model::PolicyConfig config_;
  const int64_t num_parameters_;
  const std::vector<std::string> parameter_names_;
  // Owned by the scheduler thread (and by the constructor before it starts).
  std::unique_ptr<model::Policy> policy_;
  std::unique_ptr<model::DecodeBatch> batch_;
  absl::flat_hash_map<uint64_t, std::pair<std::shared_ptr<Job>, uint32_t>> live_;  // batch id -> job, sample
  std::function<void()> fault_hook_;

  absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool drained_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t swaps_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::shared_ptr<Job>> waiting_ ABSL_GUARDED_BY(mu_);   // not fully admitted
  std::map<Job*, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);  // every unfinished job
  std::vector<std::shared_ptr<Job>> cancelled_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Install> install_ ABSL_GUARDED_BY(mu_);
  // In-flight gauges (rlfleet_rollout_queued_sequences / _active_sequences), one owner
  // each: queued_ rises in Submit and falls only in LeaveQueueLocked (both under mu_);
  // active_ follows the batch's size after every change to the batch.
  metrics::InflightGauge queued_;
  int queued_generate_ ABSL_GUARDED_BY(mu_) = 0;  // of queued_, Generate's (jobs not `whole`)
  metrics::InflightGauge active_;
  uint64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t finished_sequences_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t aborted_sequences_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_sequence_id_ ABSL_GUARDED_BY(mu_) = 1;
  // tokens/s over the last full window of >= 1 s.
  double tokens_per_s_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t window_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::Now();
  // Busy fraction (LoadStats.utilization: the autoscaler's signal): the time spent in
  // prefill and decode steps over the wall time since the last report of at least 1 s.
  double busy_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time busy_since_ ABSL_GUARDED_BY(mu_) = absl::Now();
  double utilization_ ABSL_GUARDED_BY(mu_) = 0;
  // Prometheus metrics (libs/metrics' global registry).
  metrics::Counter* const tokens_metric_;
  metrics::Histogram* const step_metric_;
  metrics::Histogram* const swap_metric_;
  metrics::Histogram* const load_metric_;
  metrics::Counter* const load_bytes_metric_;
  metrics::Gauge* const version_metric_;
  std::thread scheduler_;
};

}  // namespace rlfleet::rollout

#endif  // RLFLEET_SERVICES_ROLLOUT_ROLLOUT_CORE_H_

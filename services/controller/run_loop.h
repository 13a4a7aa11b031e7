// The RL loop the controller drives, free of gRPC: prompts -> rollout replicas ->
// reward -> buffer -> trainer -> new weights -> rollout replicas, with held-out greedy
// evaluation. Peers are interfaces (gRPC adapters in run_peers_grpc.h, fakes in tests),
// so the same loop runs from the `rlfleet loop` CLI today and from
// ControllerService.StartRun next.
#ifndef RLFLEET_SERVICES_CONTROLLER_RUN_LOOP_H_
#define RLFLEET_SERVICES_CONTROLLER_RUN_LOOP_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rlfleet/v1/buffer.pb.h"
#include "rlfleet/v1/reward.pb.h"
#include "rlfleet/v1/rollout.pb.h"
#include "rlfleet/v1/trainer.pb.h"

namespace rlfleet::controller {

class RolloutReplica {
 public:
  virtual ~RolloutReplica() = default;
  virtual std::string address() const = 0;
  virtual absl::Status GenerateBatch(const v1::GenerateBatchRequest& request, v1::GenerateBatchResponse* response) = 0;
  // FAILED_PRECONDITION when the replica already has the version, a newer one, or is
  // installing another (the pool then asks InstalledVersion which it is).
  virtual absl::Status UpdateWeights(const v1::PrepareWeightsRequest& request) = 0;
  // The version the replica serves now (0 = none).
  virtual absl::StatusOr<uint64_t> InstalledVersion() = 0;
  // Installs the version on `replicas` (this one among them), a status for each in
  // their order: together where their route can (one weights-service round, the
  // replicas chained), else one after the other.
  virtual std::vector<absl::Status> UpdateWeightsTogether(const std::vector<RolloutReplica*>& replicas,
                                                          const v1::PrepareWeightsRequest& request);
  // Stops it taking new work (it is leaving the pool).
  virtual absl::Status Drain() = 0;
};

class RewardPeer {
 public:
  virtual ~RewardPeer() = default;
  virtual absl::Status Score(const v1::ScoreRequest& request, v1::ScoreResponse* response) = 0;
};

class BufferPeer {
 public:
  virtual ~BufferPeer() = default;
  virtual absl::Status Configure(const v1::ConfigureRequest& request) = 0;
  // The reply says how many were accepted, duplicates and rejected (and why).
  virtual absl::Status PutExperiences(const v1::PutExperiencesRequest& request,
                                      v1::PutExperiencesResponse* response) = 0;
  // What the buffer holds: the loop asks when TrainStep is UNAVAILABLE, to tell a
  // batch still waiting for a trainer from one an earlier attempt consumed.
  virtual absl::StatusOr<v1::GetStatsResponse> Stats() { return absl::UnimplementedError("GetStats"); }
};

class TrainerPeer {
 public:
  virtual ~TrainerPeer() = default;
  // UNAVAILABLE when the buffer had no group with a learning signal, or the trainer
  // is unreachable or restarting: the loop tells these apart itself (it knows which
  // groups it put had one) and retries within LoopConfig::unavailable_retry.
  virtual absl::Status TrainStep(const v1::TrainStepRequest& request, v1::TrainStepResponse* response) = 0;
  // The loop asks for request.min_version (the fleet's newest version + 1 after a step
  // trained; see PublishWeightsRequest) and idempotent at a run's start.
  virtual absl::Status PublishWeights(const v1::PublishWeightsRequest& request,
                                      v1::PublishWeightsResponse* response) = 0;
  // The version of the trainer's current weights (GetState). UNIMPLEMENTED by default:
  // the loop then asks for a new number at a run's start.
  virtual absl::StatusOr<uint64_t> PolicyVersion() { return absl::UnimplementedError("PolicyVersion"); }
  // Writes the trainer's model, optimizer and step to request.path (a directory on the
  // trainer's machine, under its checkpoint root).
  virtual absl::Status SaveCheckpoint(const v1::SaveCheckpointRequest& request,
                                      v1::SaveCheckpointResponse* response) = 0;
};

// The rollout replicas of a run. Prompts are split evenly over the live replicas and
// generated concurrently; a replica that fails with UNAVAILABLE (dead),
// DEADLINE_EXCEEDED (hung past its call deadline) or CANCELLED (its server stopping) is
// dropped and its prompts go to the others, so a run survives losing replicas as long as one is left. A replica
// that is busy (RESOURCE_EXHAUSTED: its queue is full, e.g. of gateway traffic) is asked
// again after a back-off while the others take the chunk; one that fails to decode a
// chunk (INTERNAL, ABORTED: an out-of-memory) stays, and the chunk is tried again, three
// times in all. Other errors (a request the replica rejects) are returned as they are. A replica that refuses a
// version with FAILED_PRECONDITION counts as installed only if it reports serving
// exactly that version; otherwise (a newer version from another run, another install
// in progress, shutting down) it cannot serve this run's policy and is dropped.
// Thread-safe, and concurrent: calls to the replicas run outside the pool's lock, so
// several Generate calls, a weight update (replicas swap at a decode-step boundary,
// mid-generation) and scaling go on at once; weight updates take turns.
class RolloutPool {
 public:
  using Log = std::function<void(const std::string&)>;
  RolloutPool(std::vector<std::unique_ptr<RolloutReplica>> replicas, Log log);

  int live();
  // Completions for every prompt of `request`, `num_samples` each, in prompt order (as
  // one GenerateBatch would list them). UNAVAILABLE when no replica is left.
  // Calls carry at least `min_prompts_per_call` prompts (a fully asynchronous run's
  // producers make one call of each of theirs: their concurrency spreads the work).
  absl::Status Generate(const v1::GenerateBatchRequest& request, v1::GenerateBatchResponse* response,
                        int min_prompts_per_call = 1);
  // Installs a version on every live replica (and on those waiting to be admitted).
  absl::Status UpdateWeights(const v1::PrepareWeightsRequest& request);

  // Scaling: a replica first gets the weights the pool last installed, then it is
  // admitted and gets work from the next Generate call; before the run has published any,
  // it waits and joins with the first UpdateWeights. An error installing them is
  // returned and it does not join. ALREADY_EXISTS for an address in the pool.
  absl::Status Admit(std::unique_ptr<RolloutReplica> replica);
  // A replica leaves: no new call goes to it, and it is drained (its calls in flight
  // finish; what it refuses from then on goes to the other replicas: nothing is lost).
  // NOT_FOUND for an address not in the pool.
  absl::Status Remove(const std::string& address);
  // Addresses of the live replicas.
  std::vector<std::string> addresses();
  // The newest version any live replica reports serving (0: none, or none answered):
  // what a run that starts or resumes must not reuse for other weights.
  uint64_t NewestInstalledVersion();

 private:
  struct Replica {
    std::shared_ptr<RolloutReplica> peer;  // (shared: calls in flight outlive a removal)
    bool alive = true;
  };
  void Drop(Replica& replica, const absl::Status& why, const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `peer` if it is live in the pool (it may have been removed meanwhile).
  void DropPeer(RolloutReplica* peer, const absl::Status& why, const std::string& what) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<RolloutReplica>> LivePeersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ALREADY_EXISTS when `address` is live in the pool or waits to join it.
  absl::Status JoinedLocked(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Mutex update_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one UpdateWeights at a time
  std::atomic<uint64_t> next_first_{0};              // the replica the next call starts at
  absl::Mutex mu_;
  std::vector<Replica> replicas_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<RolloutReplica>> waiting_ ABSL_GUARDED_BY(mu_);  // for the first weights
  std::optional<v1::PrepareWeightsRequest> weights_ ABSL_GUARDED_BY(mu_);      // last installed
  Log log_;
};

struct LoopProgress {
  int step = 0;
  double seconds = 0;
  uint64_t policy_version = 0;     // of the rollouts this step (eval's at eval steps)
  double train_reward = 0;         // mean over the step's samples
  float entropy = 0;               // of the last step that trained
  int idle_steps = 0;              // steps whose every group had zero reward variance
  uint64_t trained_sequences = 0;  // summed over the steps that trained
  std::optional<double> held_out_exact;
  // This step's phases: generating and scoring its rollouts (in async mode that
  // overlapped the previous step's training), TrainStep, and the weight sync
  // (PublishWeights + every replica installing the version).
  double generate_seconds = 0, train_seconds = 0, sync_seconds = 0;
  double tokens_per_s = 0;      // response tokens of this step's rollouts / generate_seconds
  float mean_staleness = 0;     // version lag of the trained batch (the trainer's figure)
  float loss = 0;               // of the last step that trained
  float approx_kl = 0;          // KL(behaviour || new) estimate, of the last step that trained
  float grad_norm = 0;          // before clipping, of the last step that trained
  std::string last_checkpoint;  // path of the last checkpoint written; empty = none
  // Periodic checkpoints that failed (a full disk, a trainer that could not write): each
  // logged, and the next interval tries again; the run goes on.
  int failed_checkpoints = 0;
  // Experiences the buffer took from this run (accepted, and on a retried or resumed
  // put the duplicates of what an earlier attempt stored).
  uint64_t accepted_experiences = 0;
  // For a resume: the tag in this run's ids (RunLoop's) and the newest version the run
  // installed on its replicas.
  std::string tag;
  uint64_t published_version = 0;
};

// RunConfig.checkpoint_keep_last when unset, and its largest value.
inline constexpr int kDefaultCheckpointKeepLast = 3;
inline constexpr int kMaxCheckpointKeepLast = 100000;

struct LoopConfig {
  // The run's id, given to the buffer (Configure / PutExperiences run_id); empty = none.
  std::string run_id;
  std::string task = "reverse";  // a built-in task (unless `dataset` is set)
  int min_len = 3;
  int max_len = 5;
  // A prompt dataset instead of a built-in task (prompt_source.h): a JSONL file on the
  // controller's machine, its prompts tokenized by the tokenizer.json of `tokenizer_dir`
  // (the model directory the rollout and trainer run), each scored as `dataset_task`
  // against its record's answer; `held_out` records held out.
  std::string dataset;
  std::string tokenizer_dir;
  std::string prompt_field = "prompt";
  std::string answer_field = "answer";
  std::string dataset_task = "math";
  // The chat template of `tokenizer_dir` renders records given as chat messages and,
  // with `apply_chat_template`, prompt strings (as one user message); its extra
  // variables are `chat_template_kwargs` (a JSON object's text; empty = none).
  bool apply_chat_template = false;
  std::string chat_template_kwargs;
  int steps = 200;
  int prompts = 32;      // groups per step
  int samples = 8;       // group size
  int eval_every = 10;   // held-out greedy evaluation; 0 = never
  int held_out = 64;     // held-out prompts
  double stop_at = 1.0;  // stop once held-out exact match reaches this
  double lr = 5e-4;
  int ppo_epochs = 2;
  double entropy_coef = 0.0;
  double temperature = 1.0;
  uint64_t seed = 11;  // prompts and held-out set
  // 0: synchronous (generate, then train, then publish). k > 0: the next step's
  // generation overlaps this step's training, and the trainer accepts experiences up to
  // k versions old (the buffer drops older ones).
  int max_staleness = 0;
  // Fully asynchronous (needs max_staleness >= 1): the rollouts are made without a step
  // barrier, by producers that generate, score and put groups as they finish, up to
  // max_staleness steps ahead of the trainer; each step trains once its groups are in
  // the buffer and its new version installs on the replicas mid-generation.
  bool fully_async = false;
  int max_new_tokens = 0;        // response cap of the training rollouts; 0 = max_len + 3
  double clip_ratio = 0.2;       // PPO clip epsilon
  double clip_ratio_high = 0.0;  // upper clip epsilon (clip-higher); 0 = clip_ratio
  // Checkpoints: to checkpoint_dir/<run id or tag>-step-<N> on the trainer every
  // checkpoint_every steps and, when the run completes, after its last step; 0 = none
  // from the loop (RunManager saves one at StopRun when asked). Empty dir = none. A
  // periodic save that fails is logged and counted (failed_checkpoints) and the next
  // interval saves again; the save at the end fails the run.
  std::string checkpoint_dir;
  int checkpoint_every = 0;
  // Retention: each save asks the trainer to keep only the newest this many of the
  // run's checkpoints (SaveCheckpointRequest.keep_last); 0 = keep all.
  int checkpoint_keep_last = kDefaultCheckpointKeepLast;
  // How long a peer may answer UNAVAILABLE (restarting: the trainer, buffer, reward or
  // weights service; Redis behind the buffer) before the run fails; TrainStep's for a
  // step whose batch had a learning signal (without one it means "nothing to learn").
  absl::Duration unavailable_retry = absl::Seconds(60);
  // Resumes a run (a restarted controller's) after resume->step: the same tag in its
  // ids, the prompts of the steps after it, its progress so far. The first step again
  // may find its experiences already stored (their ids are duplicates): they count as
  // accepted, and its TrainStep's UNAVAILABLE as idle (they may be trained already).
  std::optional<LoopProgress> resume;
};

// INVALID_ARGUMENT naming the field for a config out of range or an unknown task.
absl::Status ValidateLoopConfig(const LoopConfig& config);

// Saves a checkpoint of `trainer` as config.checkpoint_dir/`name`-step-`step` and
// returns its path (UNAVAILABLE retried as RunLoop does, until `stop`), the trainer
// keeping config.checkpoint_keep_last of the run's checkpoints. The trainer's error
// (annotated) when it cannot. With `dry_run` the trainer only checks that it could
// (SaveCheckpointRequest.dry_run) and writes nothing.
absl::StatusOr<std::string> SaveStepCheckpoint(TrainerPeer& trainer, const LoopConfig& config,
                                               const std::atomic<bool>& stop, const std::string& name, int step,
                                               bool dry_run = false);

// Runs the loop until config.steps, config.stop_at, `stop`, or an error (annotated with
// the step and the peer call). Calls `on_progress` after every step. Request, group and
// experience ids carry a tag new to each call, so that a second run on the same buffer
// is not refused as duplicates of the first. A step whose groups all have zero reward
// variance has nothing to learn: TrainStep's UNAVAILABLE then makes it an idle step;
// for a step with a signal UNAVAILABLE is retried until config.unavailable_retry, then
// returned, as are the other peers' (Score, PutExperiences, PublishWeights,
// SaveCheckpoint: each safe to repeat). FAILED_PRECONDITION if the buffer accepted
// none of a step's experiences, or if every step of a run that went its length was
// idle (nothing was trained).
absl::Status RunLoop(const LoopConfig& config, RolloutPool& rollout, RewardPeer& reward, BufferPeer& buffer,
                     TrainerPeer& trainer, const std::atomic<bool>& stop,
                     const std::function<void(const LoopProgress&)>& on_progress);

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_RUN_LOOP_H_

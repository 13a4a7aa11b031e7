// TrainerCore: the trainer without gRPC. TrainStep takes a batch (inline, or sampled
// from the buffer through a BufferSource), computes advantages (GRPO group-norm,
// Dr. GRPO group-mean, RLOO; or GAE from the value head for PPO), runs a PPO-clip
// update on the policy (libs/model, libs/rl) and bumps the policy version.
// Checkpoints are a directory (weights, optimizer state, state.txt) written atomically,
// only under the configured checkpoint root (checkpoint.h).
//
// Exactly-once training of buffer batches: a lease is acked after its step; when the
// ack fails the step still counts, the lease's experience ids are remembered and its
// ack retried before the next sample, and groups of it that the buffer hands out
// again (the lease expired) are acked without being trained on again.
//
// Data parallelism: with a GradientGroup of D ranks, rank 0 is the one the API talks
// to; for each step it broadcasts the batch (sequences with their advantages) and the
// options, every rank trains on sequences i with i % D == rank, and the gradients are
// combined in the group, so all ranks hold the same weights. The other ranks run
// ServeWorker. While idle, rank 0 broadcasts a keepalive so that a waiting worker's
// deadline never passes and a dead worker is an error at rank 0's next broadcast.
// Thread-safe (steps are serialised).
#ifndef RLFLEET_SERVICES_TRAINER_TRAINER_CORE_H_
#define RLFLEET_SERVICES_TRAINER_TRAINER_CORE_H_

#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/host_buffer.h"
#include "libs/common/ids.h"
#include "libs/metrics/metrics.h"
#include "libs/model/policy.h"
#include "libs/transport/transport.h"
#include "rlfleet/v1/buffer.pb.h"
#include "rlfleet/v1/trainer.pb.h"
#include "services/trainer/checkpoint.h"

namespace rlfleet::trainer {

// Where BufferSource batches come from (the buffer's gRPC client, or a BufferCore in
// tests). Implementations are thread-safe.
class BufferSource {
 public:
  virtual ~BufferSource() = default;
  virtual absl::Status Sample(const v1::SampleBatchRequest& request, v1::SampleBatchResponse* response) = 0;
  virtual absl::Status Ack(const std::string& lease_id) = 0;
  virtual absl::Status Nack(const std::string& lease_id, const std::string& reason) = 0;
};

class TrainerCore {
 public:
  // `buffer` may be null (inline batches only); `group` may be null (one rank); neither
  // is owned. `checkpoint_root`: the directory every checkpoint path resolves under
  // (created at the first save); empty: SaveCheckpoint and LoadCheckpoint are refused.
  // `checkpoint_owner` tags this trainer's save directories (checkpoint.h SaveDir;
  // INVALID_ARGUMENT unless ValidateCheckpointOwner accepts it): trainers that share a
  // root need different owners, and a restarted trainer the same one.
  static absl::StatusOr<std::unique_ptr<TrainerCore>> Create(const model::PolicyConfig& config,
                                                             const std::string& device, uint64_t seed,
                                                             BufferSource* buffer = nullptr,
                                                             dist::GradientGroup* group = nullptr,
                                                             std::filesystem::path checkpoint_root = {},
                                                             std::string checkpoint_owner = kDefaultCheckpointOwner);
  ~TrainerCore();  // rank 0 of a group tells the workers to stop

  // Ranks > 0: runs what rank 0 broadcasts (steps, checkpoint loads, keepalives)
  // until it says stop (OK) or the group fails (its error).
  absl::Status ServeWorker();

  // Every request field is checked first (train_options.h): INVALID_ARGUMENT naming
  // the field for a bad value (NaN included) or batch, UNIMPLEMENTED naming it for
  // what this trainer does not do (KL without a reference model); FAILED_PRECONDITION
  // when expected_step is not the next step (a retried step that already ran), for GAE
  // without a value head, or a batch with fewer sequences than data-parallel ranks;
  // INTERNAL for a non-finite loss (nothing applied, the step does not count); errors
  // of the buffer and of the group as they come. A failed update nacks its lease, so
  // nothing sampled is lost; a failed ack after a step is retried (see above).
  absl::Status TrainStep(const v1::TrainStepRequest& request, v1::TrainStepResponse* response);

  absl::Status GetState(v1::GetStateResponse* response);
  // The name this trainer samples the buffer under (SampleBatch consumer_id, with a
  // nonce of this process): stable across restarts, e.g. "trainer@<address>", so that a
  // restarted trainer's first sample frees the groups its predecessor leased.
  void SetConsumerName(std::string name) {
    absl::MutexLock lock(&mu_);
    consumer_name_ = std::move(name);
  }
  // The path (absolute, or relative to the root) must resolve inside the checkpoint
  // root and not be the root itself: INVALID_ARGUMENT naming `path` otherwise, or
  // without a root. ALREADY_EXISTS unless overwrite; with overwrite, FAILED_PRECONDITION
  // unless what is there is a checkpoint this trainer wrote (nothing else is removed).
  // With keep_last, after a save that succeeded, the series' older checkpoints beyond
  // keep_last go (PruneCheckpointSeries; response.pruned); INVALID_ARGUMENT before
  // anything is written for a keep_last over kMaxKeepLast or a path not named
  // <name>-step-<N>. A checkpoint pruning cannot remove is logged; the save stands.
  absl::Status SaveCheckpoint(const v1::SaveCheckpointRequest& request, v1::SaveCheckpointResponse* response);
  // Paths as SaveCheckpoint. NOT_FOUND for a missing checkpoint; FAILED_PRECONDITION
  // for one of another model shape; DATA_LOSS for a corrupt one; INVALID_ARGUMENT for
  // one whose state.txt names a file outside it, not regular or too large. The files
  // are read and checked before the trainer's lock is taken.
  absl::Status LoadCheckpoint(const v1::LoadCheckpointRequest& request, v1::LoadCheckpointResponse* response);
  // Loads a Hugging Face model directory's weights (a policy made from its config.json;
  // hf_model.h) as the starting point, and keeps the directory: checkpoints copy its
  // tokenizer files and keep its config.json's other keys. Errors as model::LoadHfWeights (nothing changes). Every rank
  // of a group loads the directory itself.
  absl::Status LoadModelDir(const std::string& dir);
  // Cleans up after this trainer's saves that did not finish (killed, a full disk):
  // CleanInterruptedSaves under the checkpoint root with this trainer's owner, each
  // line logged to stderr and returned. Call at start, before ResumeLatest (an overwrite
  // stopped between its renames has its checkpoint restored first); SaveCheckpoint
  // calls it after every save that succeeds. Nothing without a root.
  std::vector<std::string> CleanCheckpointRoot();
  // Test hook: stops every save at the phase where `fault` returns true, as a kill
  // there would (ABORTED, nothing cleaned up). Set before any call.
  void SetSaveFaultForTest(SaveFault fault) { save_fault_ = std::move(fault); }
  // Loads the checkpoint written last under the checkpoint root (FindLatestCheckpoint),
  // as LoadCheckpoint would (`response`: its step and version), and returns its path.
  // NOT_FOUND when there is none (or no root); LoadCheckpoint's errors otherwise.
  absl::StatusOr<std::string> ResumeLatest(v1::LoadCheckpointResponse* response);

  // Where published versions go: a directory (a safetensors file per version, written
  // atomically: TRANSFER_BACKEND_FILE, for one machine), or else this trainer's data
  // plane (the image kept in memory and registered, the latest two versions: the
  // weights service or the replicas pull it, from any host).
  struct PublishTarget {
    std::string dir;
    transport::Transport* data_plane = nullptr;  // not owned
    // On CUDA: the latest this many versions are also kept as DeviceImages in GPU
    // memory (F32, the model's size each), described in the reply's device_image, so
    // that replicas on this host install GPU to GPU (CUDA IPC). 0: none.
    int device_images = 0;
  };
  // Faults in memory for one in-memory version now (the model's image size), so that
  // the first publish does not pay for fresh memory; later ones reuse retired versions'.
  void PrefaultPublishMemory();

  // Publishes the current weights (a safetensors image with its XXH64 digest) and
  // describes where they are. With request.idempotent and the current version already
  // published, returns that publication again and sets *republished (nothing written).
  // A request.min_version above the current version renumbers the current weights to
  // it first (a trainer resumed from an older checkpoint than the replicas' weights).
  // INVALID_ARGUMENT for a wire_dtype that is not a float type or a timeout_ms out of
  // 0..3600000; UNIMPLEMENTED for BFLOAT16 / FLOAT16 (replicas install float32);
  // FAILED_PRECONDITION with neither a directory nor a data plane; the data plane's
  // error if the image cannot be registered.
  absl::Status Publish(const PublishTarget& target, const v1::PublishWeightsRequest& request,
                       v1::PublishWeightsResponse* response, bool* republished = nullptr);

  // For tests: unsynchronised access, valid while no call is in flight.
  model::Policy* policy() ABSL_NO_THREAD_SAFETY_ANALYSIS { return policy_.get(); }

 private:
  TrainerCore(std::unique_ptr<model::Policy> policy, BufferSource* buffer, std::string device,
              dist::GradientGroup* group, std::filesystem::path checkpoint_root, std::string checkpoint_owner);
  std::vector<std::string> CleanCheckpointRootLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rank 0: broadcasts a command; ranks > 0 receive it in ServeWorker.
  absl::Status BroadcastLocked(std::string command) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Trains this rank's part of `seqs` (all of it without a group).
  absl::StatusOr<model::TrainStats> TrainPartLocked(const std::vector<model::TrainSequence>& seqs,
                                                    model::TrainOptions options) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resolves a request's checkpoint path under the root.
  absl::StatusOr<std::filesystem::path> CheckpointPath(const std::string& path) const;
  // Installs a checkpoint read (and checked) by ReadCheckpoint without the lock.
  absl::Status InstallLocked(CheckpointContents contents, v1::LoadCheckpointResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Acks a lease after its step; a failed ack is remembered (UnackedLease). `trained`:
  // the ids trained on under it; `redelivered`: ids of groups trained before that came
  // back with it (forgotten once it is acked).
  void AckLocked(const std::string& lease_id, const std::vector<std::string>& trained,
                 const std::vector<std::string>& redelivered) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Acks leases whose ack failed after their step (before the next sample).
  void RetryAcksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether experience `id` was trained on in a lease not yet acked.
  bool TrainedUnackedLocked(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Keepalive();  // rank 0 of a group

  // A lease trained on whose ack failed: its ack is retried, and its experiences, if
  // the buffer hands them out again, are acked without training.
  struct UnackedLease {
    std::string lease_id;
    bool retry_ack = true;  // false once the buffer said it expired (the groups come back)
    absl::flat_hash_set<std::string> experience_ids;
  };
  static constexpr size_t kMaxUnackedLeases = 64;
  static constexpr int64_t kMaxPublishTimeoutMs = 3600000;
  static constexpr uint64_t kMaxVersion = uint64_t{1} << 48;  // (the buffer's bound too)

  // A version published in memory.
  struct Published {
    uint64_t version = 0;
    common::HostBuffer bytes;  // (back to publish_pool_ when dropped)
    uint64_t digest = 0;       // XXH64 of bytes
    transport::MemoryHandle handle;
    transport::Transport* data_plane = nullptr;
  };

  // The latest versions' device images (oldest first), exporting the current one (its
  // memory the oldest's when there are `keep` already); logs and carries on without one
  // when the export fails (the host image serves every replica then).
  void ExportDeviceVersionLocked(int keep, v1::CudaIpcImage* described) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::unique_ptr<model::Policy> policy_ ABSL_GUARDED_BY(mu_);
  // Versions kept in GPU memory for same-host replicas (PublishTarget::device_images;
  // each image's ref().version is the version it holds).
  std::deque<model::DeviceImage> device_versions_ ABSL_GUARDED_BY(mu_);
  std::deque<Published> published_ ABSL_GUARDED_BY(mu_);  // the latest two, in memory
  // Memory for the next image: a dropped one's, or faulted in at start.
  const std::shared_ptr<common::BufferPool> publish_pool_ = std::make_shared<common::BufferPool>(1);
  BufferSource* const buffer_;
  const std::string device_;
  const std::filesystem::path checkpoint_root_;               // absolute; empty: no checkpoints
  const std::string checkpoint_owner_;                        // tags this trainer's save directories
  SaveFault save_fault_;                                      // (tests)
  const int64_t num_parameters_;                              // the policy's (its shape never changes)
  const uint64_t max_checkpoint_file_bytes_;                  // (from the model's size)
  std::filesystem::path tokenizer_dir_ ABSL_GUARDED_BY(mu_);  // --model_dir: its config, tokenizer into checkpoints
  std::deque<UnackedLease> unacked_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::PublishWeightsResponse> last_publish_ ABSL_GUARDED_BY(mu_);  // of the latest publication
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::string consumer_name_ ABSL_GUARDED_BY(mu_) = "trainer-0";
  const std::string incarnation_ = common::NewId("p");  // (this process's)
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;           // the initial weights are version 1
  v1::TrainMetrics last_ ABSL_GUARDED_BY(mu_);
  dist::GradientGroup* const group_;               // null: one rank
  absl::Status group_error_ ABSL_GUARDED_BY(mu_);  // a failed collective: the group is unusable
  absl::Time last_broadcast_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread keepalive_;
  // Prometheus metrics (libs/metrics' global registry).
  metrics::Histogram* const step_metric_;
  metrics::Counter* const steps_metric_;
  metrics::Gauge* const loss_metric_;
  metrics::Gauge* const version_metric_;
  metrics::Counter* const ack_failures_metric_;
};

}  // namespace rlfleet::trainer

#endif  // RLFLEET_SERVICES_TRAINER_TRAINER_CORE_H_

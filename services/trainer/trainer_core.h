// TrainerCore: the trainer without gRPC. TrainStep takes a batch (inline, or sampled
// from the buffer through a BufferSource), computes advantages (GRPO group-norm,
// Dr. GRPO group-mean, RLOO; or GAE from the value head for PPO), runs a PPO-clip
// update on the policy (libs/model, libs/rl) and bumps the policy version.
// Checkpoints are a directory (weights, optimizer state, state.txt) written atomically.
//
// Data parallelism: with a GradientGroup of D ranks, rank 0 is the one the API talks
// to; for each step it broadcasts the batch (sequences with their advantages) and the
// options, every rank trains on sequences i with i % D == rank, and the gradients are
// combined in the group, so all ranks hold the same weights. The other ranks run
// ServeWorker. While idle, rank 0 broadcasts a keepalive so that a waiting worker's
// deadline never passes and a dead worker is an error at rank 0's next broadcast.
// Not yet: PublishWeights through the weights service.
// Thread-safe (steps are serialised).
#ifndef RLFLEET_SERVICES_TRAINER_TRAINER_CORE_H_
#define RLFLEET_SERVICES_TRAINER_TRAINER_CORE_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/metrics/metrics.h"
#include "libs/model/policy.h"
#include "libs/transport/transport.h"
#include "rlfleet/v1/buffer.pb.h"
#include "rlfleet/v1/trainer.pb.h"

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
  // is owned.
  static absl::StatusOr<std::unique_ptr<TrainerCore>> Create(const model::PolicyConfig& config,
                                                             const std::string& device, uint64_t seed,
                                                             BufferSource* buffer = nullptr,
                                                             model::GradientGroup* group = nullptr);
  ~TrainerCore();  // rank 0 of a group tells the workers to stop

  // Ranks > 0: runs what rank 0 broadcasts (steps, checkpoint loads, keepalives)
  // until it says stop (OK) or the group fails (its error).
  absl::Status ServeWorker();

  // INVALID_ARGUMENT naming the field for a bad request or batch; FAILED_PRECONDITION
  // when expected_step is not the next step (a retried step that already ran);
  // FAILED_PRECONDITION for GAE without a value head, or a batch with fewer sequences
  // than data-parallel ranks; errors of the buffer and of the group as they come.
  // A failed update nacks its lease, so nothing sampled is lost.
  absl::Status TrainStep(const v1::TrainStepRequest& request, v1::TrainStepResponse* response);

  absl::Status GetState(v1::GetStateResponse* response);
  // INVALID_ARGUMENT for an empty path; ALREADY_EXISTS unless overwrite.
  absl::Status SaveCheckpoint(const v1::SaveCheckpointRequest& request, v1::SaveCheckpointResponse* response);
  // NOT_FOUND for a missing checkpoint; INVALID_ARGUMENT for one of another shape.
  absl::Status LoadCheckpoint(const v1::LoadCheckpointRequest& request, v1::LoadCheckpointResponse* response);

  // Where published versions go: a directory (a safetensors file per version, written
  // atomically: TRANSFER_BACKEND_FILE, for one machine), or else this trainer's data
  // plane (the image kept in memory and registered, the latest two versions: the
  // weights service or the replicas pull it, from any host).
  struct PublishTarget {
    std::string dir;
    transport::Transport* data_plane = nullptr;  // not owned
  };
  // Faults in memory for one in-memory version now (the model's image size), so that
  // the first publish does not pay for fresh memory; later ones reuse retired versions'.
  void PrefaultPublishMemory();

  // Publishes the current weights (a safetensors image with its XXH64 digest) and
  // describes where they are. FAILED_PRECONDITION with neither a directory nor a data
  // plane; the data plane's error if the image cannot be registered.
  absl::Status Publish(const PublishTarget& target, const v1::PublishWeightsRequest& request,
                       v1::PublishWeightsResponse* response);

  model::Policy* policy() { return policy_.get(); }

 private:
  TrainerCore(std::unique_ptr<model::Policy> policy, BufferSource* buffer, std::string device,
              model::GradientGroup* group);
  // Rank 0: broadcasts a command; ranks > 0 receive it in ServeWorker.
  absl::Status BroadcastLocked(std::string command) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Trains this rank's part of `seqs` (all of it without a group).
  absl::StatusOr<model::TrainStats> TrainPartLocked(const std::vector<model::TrainSequence>& seqs,
                                                    model::TrainOptions options) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status LoadLocked(const std::string& path, v1::LoadCheckpointResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Keepalive();  // rank 0 of a group

  // A version published in memory.
  struct Published {
    uint64_t version = 0;
    std::string bytes;
    uint64_t digest = 0;  // XXH64 of bytes
    transport::MemoryHandle handle;
    transport::Transport* data_plane = nullptr;
  };

  absl::Mutex mu_;
  std::unique_ptr<model::Policy> policy_ ABSL_GUARDED_BY(mu_);
  std::deque<Published> published_ ABSL_GUARDED_BY(mu_);  // the latest two, in memory
  std::string spare_image_ ABSL_GUARDED_BY(mu_);           // memory for the next image
  BufferSource* const buffer_;
  const std::string device_;
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;  // the initial weights are version 1
  v1::TrainMetrics last_ ABSL_GUARDED_BY(mu_);
  model::GradientGroup* const group_;  // null: one rank
  absl::Status group_error_ ABSL_GUARDED_BY(mu_);  // a failed collective: the group is unusable
  absl::Time last_broadcast_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread keepalive_;
  // Prometheus metrics (libs/metrics' global registry).
  metrics::Histogram* const step_metric_;
  metrics::Counter* const steps_metric_;
  metrics::Gauge* const loss_metric_;
  metrics::Gauge* const version_metric_;
};

}  // namespace rlfleet::trainer

#endif  // RLFLEET_SERVICES_TRAINER_TRAINER_CORE_H_

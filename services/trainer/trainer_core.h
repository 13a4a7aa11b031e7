// TrainerCore: the trainer without gRPC, one data-parallel rank. TrainStep takes a
// batch (inline, or sampled from the buffer through a BufferSource), computes
// group-relative advantages (GRPO group-norm, Dr. GRPO group-mean, RLOO), runs a
// PPO-clip update on the policy (libs/model, libs/rl) and bumps the policy version.
// Checkpoints are a directory (weights.safetensors + state) written atomically.
// Not yet: GAE/value head (PPO), DP ranks, optimizer state in checkpoints,
// PublishWeights (the weights service).
// Thread-safe (steps are serialised).
#ifndef RLFLEET_SERVICES_TRAINER_TRAINER_CORE_H_
#define RLFLEET_SERVICES_TRAINER_TRAINER_CORE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/model/policy.h"
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
  // `buffer` may be null (inline batches only); not owned.
  static absl::StatusOr<std::unique_ptr<TrainerCore>> Create(const model::PolicyConfig& config,
                                                             const std::string& device, uint64_t seed,
                                                             BufferSource* buffer = nullptr);

  // INVALID_ARGUMENT naming the field for a bad request or batch; FAILED_PRECONDITION
  // when expected_step is not the next step (a retried step that already ran);
  // UNIMPLEMENTED for GAE (PPO with a value head); errors of the buffer as they come.
  // A failed update nacks its lease, so nothing sampled is lost.
  absl::Status TrainStep(const v1::TrainStepRequest& request, v1::TrainStepResponse* response);

  absl::Status GetState(v1::GetStateResponse* response);
  // INVALID_ARGUMENT for an empty path; ALREADY_EXISTS unless overwrite.
  absl::Status SaveCheckpoint(const v1::SaveCheckpointRequest& request, v1::SaveCheckpointResponse* response);
  // NOT_FOUND for a missing checkpoint; INVALID_ARGUMENT for one of another shape.
  absl::Status LoadCheckpoint(const v1::LoadCheckpointRequest& request, v1::LoadCheckpointResponse* response);

  // Writes the current weights to <publish_dir>/policy-v<version>.safetensors
  // (atomically) and describes the file (TRANSFER_BACKEND_FILE), until the weights
  // service takes over. FAILED_PRECONDITION without a publish_dir.
  absl::Status PublishToFile(const std::string& publish_dir, const v1::PublishWeightsRequest& request,
                             v1::PublishWeightsResponse* response);

  model::Policy* policy() { return policy_.get(); }

 private:
  TrainerCore(std::unique_ptr<model::Policy> policy, BufferSource* buffer, std::string device)
      : policy_(std::move(policy)), buffer_(buffer), device_(std::move(device)) {}

  absl::Mutex mu_;
  std::unique_ptr<model::Policy> policy_ ABSL_GUARDED_BY(mu_);
  BufferSource* const buffer_;
  const std::string device_;
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;  // the initial weights are version 1
  v1::TrainMetrics last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlfleet::trainer

#endif  // RLFLEET_SERVICES_TRAINER_TRAINER_CORE_H_

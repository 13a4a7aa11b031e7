// RolloutCore: a policy replica without gRPC. Generation runs one request at a time
// over libs/model's batched Generate (continuous batching, streaming and the weight
// path's Prepare/Commit come next); every generated token is tagged with the policy
// version installed when it was decoded.
//
// States: WAITING_FOR_WEIGHTS until a version is installed, then SERVING; Drain makes
// it DRAINED (new work is UNAVAILABLE) until Resume.
// Thread-safe (requests are serialised on the model).
#ifndef RLFLEET_SERVICES_ROLLOUT_ROLLOUT_CORE_H_
#define RLFLEET_SERVICES_ROLLOUT_ROLLOUT_CORE_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/model/policy.h"
#include "rlfleet/v1/rollout.pb.h"

namespace rlfleet::rollout {

struct RolloutLimits {
  int max_prompts = 256;
  int max_sequences = 1024;  // prompts x num_samples
  int max_new_tokens = 512;
};

class RolloutCore {
 public:
  // INVALID_ARGUMENT for a config that does not make a model.
  static absl::StatusOr<std::unique_ptr<RolloutCore>> Create(const model::PolicyConfig& config,
                                                             const std::string& device,
                                                             RolloutLimits limits = {});

  // Installs weights from a safetensors file as `version` (> the installed one, else
  // FAILED_PRECONDITION). INVALID_ARGUMENT / NOT_FOUND from the file.
  absl::Status InstallFromFile(const std::string& path, uint64_t version);
  // Installs the model's current (e.g. freshly initialised) weights as `version`.
  absl::Status InstallInitial(uint64_t version);

  // FAILED_PRECONDITION without installed weights or below min_policy_version;
  // UNAVAILABLE while drained; INVALID_ARGUMENT naming the field or limit for bad input.
  absl::Status GenerateBatch(const v1::GenerateBatchRequest& request, v1::GenerateBatchResponse* response);

  absl::Status GetInfo(v1::GetInfoResponse* response);
  absl::Status Drain(const v1::DrainRequest& request, v1::DrainResponse* response);
  absl::Status Resume(v1::ResumeResponse* response);

  uint64_t installed_version();
  bool serving();

 private:
  RolloutCore(std::unique_ptr<model::Policy> policy, std::string device, RolloutLimits limits);

  const std::string device_;
  const RolloutLimits limits_;
  absl::Mutex mu_;
  std::unique_ptr<model::Policy> policy_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool drained_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t swaps_ ABSL_GUARDED_BY(mu_) = 0;
  double tokens_per_s_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rlfleet::rollout

#endif  // RLFLEET_SERVICES_ROLLOUT_ROLLOUT_CORE_H_

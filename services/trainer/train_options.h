// What a TrainStepRequest asks for, checked field by field before anything runs:
// every number in its own type (a uint32 before any cast), every float finite and in
// range, and every field either honoured (it becomes part of model::TrainOptions) or
// refused with an error naming it (STYLE.md, "Input from the network": a field a
// service accepts and ignores is a lie to its caller). Stateless; thread-safe.
#ifndef RLFLEET_SERVICES_TRAINER_TRAIN_OPTIONS_H_
#define RLFLEET_SERVICES_TRAINER_TRAIN_OPTIONS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/model/policy.h"
#include "rlfleet/v1/trainer.pb.h"

namespace rlfleet::trainer {

inline constexpr uint32_t kMaxGroups = 1024;            // buffer.num_groups
inline constexpr int kMaxInlineExperiences = 1024;      // inline_batch.experiences
inline constexpr uint32_t kMaxPpoEpochs = 16;           // params.ppo_epochs
inline constexpr uint32_t kMaxMiniBatches = 1 << 20;    // params.mini_batches (and the batch's size)
inline constexpr uint32_t kMaxWarmupSteps = 100000000;  // params.optimizer.warmup_steps
inline constexpr int64_t kMaxWaitMs = 600000;           // buffer.wait_ms (the buffer's limit)
inline constexpr double kMaxAbsReward = 1e9;            // experiences[i].reward

// The estimator `p` asks for (its algorithm's default when unspecified).
v1::AdvantageEstimator EstimatorFor(const v1::AlgorithmParams& p);

// Checks the source: buffer.num_groups in 1..1024, buffer.min_groups <= num_groups,
// buffer.wait_ms in 0..600000; inline_batch at most 1024 experiences.
// INVALID_ARGUMENT naming the field.
absl::Status CheckSource(const v1::TrainStepRequest& request);

// Checks one experience (`i` names it): reward set, finite and |reward| <= 1e9;
// response_logprobs one per response token, each finite and <= 0 (a log-probability);
// token_policy_versions empty or one per response token. extra_tensors and
// remote_payload are refused (UNIMPLEMENTED): this trainer uses no extra tensors and
// fetches no payloads (the buffer resolves them before it stores an experience).
absl::Status CheckExperience(size_t i, const v1::Experience& e);

// Every field of `p` checked and turned into TrainOptions; unset (zero) fields take the
// trainer's defaults (lr 5e-4, clip 0.2, 1 epoch, 1 mini-batch, the whole mini-batch
// per backward pass, betas 0.9 / 0.999, eps 1e-8, grad clip 1.0, no warmup).
// `batch_sequences` is the batch's size and `ranks` the data-parallel ranks
// (mini_batches must not exceed any rank's share of the batch).
// INVALID_ARGUMENT naming the field for a value out of range or not finite (NaN is
// refused everywhere); UNIMPLEMENTED naming the field for KL regularisation (this
// trainer has no reference model: kl.coef, kl.penalty IN_REWARD / IN_LOSS,
// kl.estimator and kl.target must be unset); INVALID_ARGUMENT for gamma, gae_lambda
// or value_loss_coef set without GAE (they would be ignored).
absl::StatusOr<model::TrainOptions> OptionsFromParams(const v1::AlgorithmParams& p, size_t batch_sequences, int ranks);

}  // namespace rlfleet::trainer

#endif  // RLFLEET_SERVICES_TRAINER_TRAIN_OPTIONS_H_

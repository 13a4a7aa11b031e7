#include "services/trainer/train_options.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "libs/common/checks.h"
#include "libs/common/status_macros.h"

namespace rlfleet::trainer {

using common::CheckFiniteInRange;
using common::CheckInRange;

v1::AdvantageEstimator EstimatorFor(const v1::AlgorithmParams& p) {
  if (p.advantage_estimator() != v1::ADVANTAGE_ESTIMATOR_UNSPECIFIED) return p.advantage_estimator();
  switch (p.algorithm()) {
    case v1::ALGORITHM_RLOO:
      return v1::ADVANTAGE_ESTIMATOR_LEAVE_ONE_OUT;
    case v1::ALGORITHM_PPO:
      return v1::ADVANTAGE_ESTIMATOR_GAE;
    default:
      return v1::ADVANTAGE_ESTIMATOR_GROUP_NORM;
  }
}

absl::Status CheckSource(const v1::TrainStepRequest& request) {
  if (request.has_buffer()) {
    const v1::BufferSource& b = request.buffer();
    RETURN_IF_ERROR(CheckInRange<uint32_t>("buffer.num_groups", b.num_groups(), 1, kMaxGroups));
    RETURN_IF_ERROR(CheckInRange<uint32_t>("buffer.min_groups", b.min_groups(), 0, b.num_groups()));
    RETURN_IF_ERROR(CheckInRange<int64_t>("buffer.wait_ms", b.wait_ms(), 0, kMaxWaitMs));
  } else if (request.has_inline_batch()) {
    RETURN_IF_ERROR(CheckInRange<int>("inline_batch.experiences (count)", request.inline_batch().experiences_size(), 1,
                                      kMaxInlineExperiences));
  } else {
    return absl::InvalidArgumentError("source: set buffer or a non-empty inline_batch");
  }
  return absl::OkStatus();
}

absl::Status CheckExperience(size_t i, const v1::Experience& e) {
  const std::string at = absl::StrCat("experiences[", i, "]");
  if (!e.has_reward()) return absl::InvalidArgumentError(absl::StrCat(at, ".reward is not set"));
  RETURN_IF_ERROR(CheckFiniteInRange(absl::StrCat(at, ".reward"), e.reward(), -kMaxAbsReward, kMaxAbsReward));
  if (e.response_logprobs_size() != e.response_token_ids_size()) {
    return absl::InvalidArgumentError(absl::StrCat(at, ".response_logprobs has ", e.response_logprobs_size(),
                                                   " entries, want ", e.response_token_ids_size()));
  }
  for (int j = 0; j < e.response_logprobs_size(); ++j) {
    // (a log-probability is <= 0; a little rounding above it is tolerated)
    RETURN_IF_ERROR(CheckFiniteInRange(absl::StrCat(at, ".response_logprobs[", j, "]"), e.response_logprobs(j),
                                       -std::numeric_limits<float>::max(), 1e-3));
  }
  if (e.token_policy_versions_size() != 0 && e.token_policy_versions_size() != e.response_token_ids_size()) {
    return absl::InvalidArgumentError(absl::StrCat(at, ".token_policy_versions has ", e.token_policy_versions_size(),
                                                   " entries, want 0 or ", e.response_token_ids_size()));
  }
  if (e.response_loss_mask_size() != 0 && e.response_loss_mask_size() != e.response_token_ids_size()) {
    return absl::InvalidArgumentError(absl::StrCat(at, ".response_loss_mask has ", e.response_loss_mask_size(),
                                                   " entries, want 0 or ", e.response_token_ids_size()));
  }
  if (e.extra_tensors_size() != 0) {
    return absl::UnimplementedError(absl::StrCat(
        at, ".extra_tensors: this trainer uses no extra tensors (values, reference logprobs, masks); leave it empty"));
  }
  if (e.has_remote_payload()) {
    return absl::UnimplementedError(absl::StrCat(
        at, ".remote_payload: the trainer fetches no payloads; send the tokens inline (or through the buffer)"));
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckKl(const v1::KlConfig& kl) {
  RETURN_IF_ERROR(CheckFiniteInRange("params.kl.coef", kl.coef(), 0, 1e6));
  RETURN_IF_ERROR(CheckFiniteInRange("params.kl.target", kl.target(), 0, 1e6));
  if (!v1::KlPenalty_IsValid(kl.penalty())) {
    return absl::InvalidArgumentError(absl::StrCat("params.kl.penalty ", kl.penalty(), " is not a KlPenalty"));
  }
  if (!v1::KlEstimator_IsValid(kl.estimator())) {
    return absl::InvalidArgumentError(absl::StrCat("params.kl.estimator ", kl.estimator(), " is not a KlEstimator"));
  }
  const char* kNoReference = ": KL regularisation needs a reference model, and this trainer has none";
  if (kl.penalty() == v1::KL_PENALTY_IN_REWARD || kl.penalty() == v1::KL_PENALTY_IN_LOSS) {
    return absl::UnimplementedError(absl::StrCat("params.kl.penalty ", v1::KlPenalty_Name(kl.penalty()), kNoReference));
  }
  if (kl.coef() != 0) return absl::UnimplementedError(absl::StrCat("params.kl.coef is ", kl.coef(), kNoReference));
  if (kl.estimator() != v1::KL_ESTIMATOR_UNSPECIFIED) {
    return absl::UnimplementedError(
        absl::StrCat("params.kl.estimator ", v1::KlEstimator_Name(kl.estimator()), kNoReference));
  }
  if (kl.target() != 0)
    return absl::UnimplementedError(absl::StrCat("params.kl.target is ", kl.target(), kNoReference));
  return absl::OkStatus();
}

absl::Status ApplyOptimizer(const v1::OptimizerConfig& o, model::TrainOptions* out) {
  RETURN_IF_ERROR(CheckFiniteInRange("params.optimizer.learning_rate", o.learning_rate(), 0, 1));
  RETURN_IF_ERROR(CheckFiniteInRange("params.optimizer.beta1", o.beta1(), 0, 1));
  RETURN_IF_ERROR(CheckFiniteInRange("params.optimizer.beta2", o.beta2(), 0, 1));
  for (const auto& [name, beta] :
       {std::pair{"params.optimizer.beta1", o.beta1()}, {"params.optimizer.beta2", o.beta2()}}) {
    if (beta >= 1) return absl::InvalidArgumentError(absl::StrCat(name, " is ", beta, "; it must be below 1"));
  }
  RETURN_IF_ERROR(CheckFiniteInRange("params.optimizer.eps", o.eps(), 0, 1));
  RETURN_IF_ERROR(CheckFiniteInRange("params.optimizer.weight_decay", o.weight_decay(), 0, 10));
  RETURN_IF_ERROR(CheckFiniteInRange("params.optimizer.grad_clip_norm", o.grad_clip_norm(), 0, 1e9));
  RETURN_IF_ERROR(CheckInRange<uint32_t>("params.optimizer.warmup_steps", o.warmup_steps(), 0, kMaxWarmupSteps));
  if (o.learning_rate() > 0) out->learning_rate = o.learning_rate();
  if (o.beta1() > 0) out->beta1 = o.beta1();  // 0 = unset: 0.9
  if (o.beta2() > 0) out->beta2 = o.beta2();  // 0 = unset: 0.999
  if (o.eps() > 0) out->eps = o.eps();        // 0 = unset: 1e-8
  out->weight_decay = o.weight_decay();
  if (o.grad_clip_norm() > 0) out->grad_clip = o.grad_clip_norm();  // 0 = unset: 1.0
  out->warmup_steps = static_cast<int64_t>(o.warmup_steps());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<model::TrainOptions> OptionsFromParams(const v1::AlgorithmParams& p, size_t batch_sequences, int ranks) {
  model::TrainOptions options;
  if (!v1::Algorithm_IsValid(p.algorithm())) {
    return absl::InvalidArgumentError(absl::StrCat("params.algorithm ", p.algorithm(), " is not an Algorithm"));
  }
  if (!v1::AdvantageEstimator_IsValid(p.advantage_estimator())) {
    return absl::InvalidArgumentError(
        absl::StrCat("params.advantage_estimator ", p.advantage_estimator(), " is not an AdvantageEstimator"));
  }
  // Clip: [1 - clip_ratio, 1 + clip_ratio_high]; 0 = unset (0.2; clip_ratio_high = clip_ratio).
  RETURN_IF_ERROR(CheckFiniteInRange("params.clip_ratio", p.clip_ratio(), 0, 1));
  if (p.clip_ratio() >= 1) return absl::InvalidArgumentError("params.clip_ratio must be below 1");
  RETURN_IF_ERROR(CheckFiniteInRange("params.clip_ratio_high", p.clip_ratio_high(), 0, 10));
  if (p.clip_ratio() > 0) options.clip = p.clip_ratio();
  options.clip_high = p.clip_ratio_high();
  RETURN_IF_ERROR(CheckInRange<uint32_t>("params.ppo_epochs", p.ppo_epochs(), 0, kMaxPpoEpochs));
  if (p.ppo_epochs() > 0) options.epochs = static_cast<int>(p.ppo_epochs());
  // Each data-parallel rank splits its share (at least batch / ranks sequences).
  RETURN_IF_ERROR(CheckInRange<uint32_t>("params.mini_batches", p.mini_batches(), 0, kMaxMiniBatches));
  const size_t share = batch_sequences / static_cast<size_t>(std::max(1, ranks));
  if (p.mini_batches() > share) {
    return absl::InvalidArgumentError(absl::StrCat("params.mini_batches is ", p.mini_batches(), "; this batch of ",
                                                   batch_sequences, " sequences over ", ranks, " rank(s) allows 1..",
                                                   share));
  }
  if (p.mini_batches() > 0) options.mini_batches = static_cast<int>(p.mini_batches());
  // (more than the batch is the whole batch)
  options.micro_batch_size = static_cast<int>(std::min<uint32_t>(p.micro_batch_size(), kMaxMiniBatches));
  RETURN_IF_ERROR(CheckFiniteInRange("params.entropy_coef", p.entropy_coef(), 0, 100));
  options.entropy_coef = p.entropy_coef();
  RETURN_IF_ERROR(CheckFiniteInRange("params.gamma", p.gamma(), 0, 1));
  RETURN_IF_ERROR(CheckFiniteInRange("params.gae_lambda", p.gae_lambda(), 0, 1));
  RETURN_IF_ERROR(CheckFiniteInRange("params.value_loss_coef", p.value_loss_coef(), 0, 100));
  if (EstimatorFor(p) == v1::ADVANTAGE_ESTIMATOR_GAE) {
    options.gae = true;
    if (p.gamma() > 0) options.gamma = p.gamma();                           // 0 = unset: 1.0
    if (p.gae_lambda() > 0) options.gae_lambda = p.gae_lambda();            // 0 = unset: 0.95
    if (p.value_loss_coef() > 0) options.value_coef = p.value_loss_coef();  // 0 = unset: 0.5
  } else {
    for (const auto& [name, v] : {std::pair{"params.gamma", p.gamma()},
                                  {"params.gae_lambda", p.gae_lambda()},
                                  {"params.value_loss_coef", p.value_loss_coef()}}) {
      if (v != 0) {
        return absl::InvalidArgumentError(absl::StrCat(name, " is for GAE (PPO with a value head); this step uses ",
                                                       v1::AdvantageEstimator_Name(EstimatorFor(p))));
      }
    }
  }
  RETURN_IF_ERROR(CheckKl(p.kl()));
  if (p.has_optimizer()) RETURN_IF_ERROR(ApplyOptimizer(p.optimizer(), &options));
  return options;
}

}  // namespace rlfleet::trainer

// RL math shared by the trainer (and its tests): advantage estimators and the PPO
// policy loss, over libtorch tensors. Shapes: B sequences x T response tokens; `mask`
// is 1 for real response tokens and 0 for padding. Every mean over tokens is a masked
// mean that treats a fully masked batch as zero, never NaN.
#ifndef RLFLEET_LIBS_RL_RL_H_
#define RLFLEET_LIBS_RL_RL_H_

#include <torch/torch.h>

namespace rlfleet::rl {

// GRPO: rewards [G, K] (G groups of K samples) -> (r - group mean) / (group std + eps)
// with the population std; without `scale_by_std` only the mean is removed. A group
// whose rewards are all equal gets zero advantages.
torch::Tensor GrpoAdvantages(const torch::Tensor& rewards, bool scale_by_std = true, double eps = 1e-6);

// RLOO: rewards [G, K] -> r_i - mean of the other K - 1 rewards of its group. K = 1
// gives zeros (there is no baseline).
torch::Tensor RlooAdvantages(const torch::Tensor& rewards);

struct GaeResult {
  torch::Tensor advantages;  // [B, T]
  torch::Tensor returns;     // [B, T] = advantages + values
};
// GAE(gamma, lambda) for PPO with a value head: rewards [B, T] (usually only the last
// real token carries the sequence reward), values [B, T], mask [B, T]. Positions past
// a row's last real token are masked out and do not bootstrap.
GaeResult Gae(const torch::Tensor& rewards, const torch::Tensor& values, const torch::Tensor& mask, double gamma = 1.0,
              double lambda = 0.95);

// Sum over masked positions divided by their count (0 when there are none).
torch::Tensor MaskedMean(const torch::Tensor& x, const torch::Tensor& mask);

struct PpoOptions {
  double clip = 0.2;          // PPO-clip epsilon
  double kl_coef = 0.0;       // weight of the KL penalty against the reference policy
  double entropy_coef = 0.0;  // weight of the entropy bonus
  // Off-policy correction for stale tokens: the behaviour policy (the rollout's
  // logprobs) may be older than `old` (the trainer's logprobs at the start of the
  // step); each token is weighted by exp(old - behaviour) truncated at this cap.
  // 0 disables the correction.
  double importance_cap = 2.0;
  // Upper clip epsilon (asymmetric clipping, e.g. DAPO's clip-higher): the ratio is
  // clamped to [1 - clip, 1 + clip_high]. 0 = clip (symmetric).
  double clip_high = 0.0;
};

struct PpoLoss {
  torch::Tensor loss;           // scalar to minimise
  torch::Tensor policy_loss;    // the clipped surrogate part
  torch::Tensor kl;             // masked mean k3 estimate of KL(new || ref) (0 without ref)
  torch::Tensor entropy;        // masked mean entropy (0 without entropies)
  torch::Tensor clip_fraction;  // share of tokens where the clip was active
  torch::Tensor approx_kl;      // masked mean of (old - new): drift within the step
};

// The PPO clipped policy loss. `advantages` is [B, T] or [B] (broadcast over tokens).
// `behaviour`, `reference` and `entropies` may be undefined tensors.
PpoLoss PpoPolicyLoss(const torch::Tensor& new_logprobs, const torch::Tensor& old_logprobs,
                      const torch::Tensor& advantages, const torch::Tensor& mask, const PpoOptions& options = {},
                      const torch::Tensor& behaviour_logprobs = {}, const torch::Tensor& reference_logprobs = {},
                      const torch::Tensor& entropies = {});

}  // namespace rlfleet::rl

#endif  // RLFLEET_LIBS_RL_RL_H_

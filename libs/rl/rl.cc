#include "libs/rl/rl.h"

namespace rlfleet::rl {

torch::Tensor GrpoAdvantages(const torch::Tensor& rewards, bool scale_by_std, double eps) {
  torch::Tensor mean = rewards.mean(-1, /*keepdim=*/true);
  torch::Tensor centered = rewards - mean;
  if (!scale_by_std) return centered;
  torch::Tensor stddev = rewards.std(-1, /*unbiased=*/false, /*keepdim=*/true);
  return centered / (stddev + eps);
}

torch::Tensor RlooAdvantages(const torch::Tensor& rewards) {
  const int64_t k = rewards.size(-1);
  if (k < 2) return torch::zeros_like(rewards);
  torch::Tensor sum = rewards.sum(-1, /*keepdim=*/true);
  return rewards - (sum - rewards) / static_cast<double>(k - 1);
}

torch::Tensor MaskedMean(const torch::Tensor& x, const torch::Tensor& mask) {
  torch::Tensor m = mask.to(x.dtype());
  return (x * m).sum() / m.sum().clamp_min(1.0);
}

GaeResult Gae(const torch::Tensor& rewards, const torch::Tensor& values, const torch::Tensor& mask, double gamma,
              double lambda) {
  const int64_t T = rewards.size(1);
  torch::Tensor m = mask.to(rewards.dtype());
  torch::Tensor adv = torch::zeros_like(rewards);
  torch::Tensor next_value = torch::zeros({rewards.size(0)}, rewards.options());
  torch::Tensor next_adv = torch::zeros_like(next_value);
  for (int64_t t = T - 1; t >= 0; --t) {
    torch::Tensor mt = m.select(1, t);
    // Past the row's end (mask 0) nothing flows back: next value/advantage reset.
    torch::Tensor delta = rewards.select(1, t) + gamma * next_value - values.select(1, t);
    torch::Tensor a = (delta + gamma * lambda * next_adv) * mt;
    adv.select(1, t).copy_(a);
    next_value = values.select(1, t) * mt;
    next_adv = a;
  }
  return {adv, (adv + values) * m};
}

PpoLoss PpoPolicyLoss(const torch::Tensor& new_logprobs, const torch::Tensor& old_logprobs,
                      const torch::Tensor& advantages, const torch::Tensor& mask, const PpoOptions& o,
                      const torch::Tensor& behaviour_logprobs, const torch::Tensor& reference_logprobs,
                      const torch::Tensor& entropies) {
  torch::Tensor adv = advantages.dim() == 1 ? advantages.unsqueeze(1).expand_as(new_logprobs) : advantages;
  torch::Tensor ratio = torch::exp(new_logprobs - old_logprobs);
  torch::Tensor unclipped = ratio * adv;
  const double clip_high = o.clip_high > 0 ? o.clip_high : o.clip;
  torch::Tensor clipped = torch::clamp(ratio, 1.0 - o.clip, 1.0 + clip_high) * adv;
  torch::Tensor per_token = -torch::min(unclipped, clipped);
  if (behaviour_logprobs.defined() && o.importance_cap > 0) {
    torch::Tensor w = torch::exp(old_logprobs - behaviour_logprobs).clamp_max(o.importance_cap).detach();
    per_token = per_token * w;
  }
  PpoLoss out;
  out.policy_loss = MaskedMean(per_token, mask);
  out.clip_fraction = MaskedMean((unclipped > clipped).to(new_logprobs.dtype()).detach(), mask);
  out.approx_kl = MaskedMean((old_logprobs - new_logprobs).detach(), mask);
  out.loss = out.policy_loss;
  out.kl = torch::zeros({}, new_logprobs.options());
  out.entropy = torch::zeros({}, new_logprobs.options());
  if (reference_logprobs.defined()) {
    // k3: E[exp(ref - new) - (ref - new) - 1] >= 0, unbiased for KL(new || ref).
    torch::Tensor d = reference_logprobs - new_logprobs;
    out.kl = MaskedMean(torch::exp(d) - d - 1.0, mask);
    out.loss = out.loss + o.kl_coef * out.kl;
  }
  if (entropies.defined()) {
    out.entropy = MaskedMean(entropies, mask);
    out.loss = out.loss - o.entropy_coef * out.entropy;
  }
  return out;
}

}  // namespace rlfleet::rl

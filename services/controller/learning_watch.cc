#include "services/controller/learning_watch.h"

#include "absl/strings/str_format.h"

namespace rlfleet::controller {

std::optional<std::string> LearningWatch::Observe(LoopProgress* p) {
  if (p->held_out_exact && (p->best_step == 0 || *p->held_out_exact > p->best_exact)) {
    p->best_exact = *p->held_out_exact;
    p->best_step = p->step;
  }
  if (p->held_out_exact && *p->held_out_exact >= target_ && !p->reached_target) {
    p->reached_target = true;
    p->goal_step = p->step;
  }
  // (entropy 0: no step has trained yet, nothing is known)
  if (floor_ <= 0 || p->entropy <= 0) return std::nullopt;
  if (!window_.empty() && window_.back().first == p->step) window_.pop_back();  // (a step reported again)
  window_.push_back({p->step, {p->entropy, p->zero_variance_share}});
  while (window_.size() > static_cast<size_t>(kCollapseSteps)) window_.pop_front();
  if (window_.size() < static_cast<size_t>(kCollapseSteps) || p->reached_target || p->best_exact >= target_) {
    return std::nullopt;
  }
  double entropy = 0, zero_variance = 0;
  for (const auto& [step, figures] : window_) {
    entropy += figures.first / kCollapseSteps;
    zero_variance += figures.second / kCollapseSteps;
  }
  if (entropy >= floor_ || zero_variance < kCollapseZeroVariance) return std::nullopt;
  if (p->collapsed_at_step == 0) {  // (from the window's first step under the floor)
    p->collapsed_at_step = window_.front().first;
    for (auto it = window_.rbegin(); it != window_.rend() && it->second.first < floor_; ++it) {
      p->collapsed_at_step = it->first;
    }
  }
  if (warned_) return std::nullopt;
  warned_ = true;
  return CollapseLine(p->collapsed_at_step, entropy, floor_, kCollapseSteps, p->best_exact, target_, zero_variance);
}

std::string CollapseLine(int collapsed_at_step, double entropy, double floor, int steps, double best_exact,
                         double target, double zero_variance_share) {
  return absl::StrFormat(
      "policy collapsed at step %d: entropy %.3f nats/token (mean of %d steps), under the floor %.3f, and %.0f%% of "
      "the groups had no reward spread, so little is left to learn from, while held-out exact match (best %.3f) is "
      "under the target %.3f. Try --clip_ratio_high=0.28, a higher --entropy_coef or --temperature, or another "
      "--seed",
      collapsed_at_step, entropy, steps, floor, 100 * zero_variance_share, best_exact, target > 1 ? 1.0 : target);
}

}  // namespace rlfleet::controller

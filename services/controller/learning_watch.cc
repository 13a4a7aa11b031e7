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
  const bool below = floor_ > 0 && p->entropy > 0 && p->entropy < floor_;
  if (!below) {
    below_since_ = 0;
    return std::nullopt;
  }
  if (below_since_ == 0) below_since_ = p->step;
  const int steps_below = p->step - below_since_ + 1;
  if (p->reached_target || steps_below < kCollapseSteps || p->best_exact >= target_) return std::nullopt;
  if (p->collapsed_at_step == 0) p->collapsed_at_step = below_since_;
  if (warned_) return std::nullopt;
  warned_ = true;
  return CollapseLine(p->collapsed_at_step, p->entropy, floor_, steps_below, p->best_exact, target_,
                      p->zero_variance_share);
}

std::string CollapseLine(int collapsed_at_step, double entropy, double floor, int steps_below, double best_exact,
                         double target, double zero_variance_share) {
  return absl::StrFormat(
      "policy collapsed at step %d: entropy %.3f nats/token, under the floor %.3f for %d steps, while held-out "
      "exact match (best %.3f) is under the target %.3f; %.0f%% of the last step's groups had no reward spread, so "
      "little is left to learn from. Try --clip_ratio_high=0.28, a higher --entropy_coef or --temperature, or "
      "another --seed",
      collapsed_at_step, entropy, floor, steps_below, best_exact, target > 1 ? 1.0 : target, 100 * zero_variance_share);
}

}  // namespace rlfleet::controller

// What a run's user needs to read its learning: the best held-out score so far,
// whether the run reached its target (LoopConfig::stop_at) and at which step, and
// whether the policy collapsed: its entropy stayed under LoopConfig::entropy_floor for
// kCollapseSteps steps while held-out was under the target (a confident policy whose
// groups all score alike, so the zero-variance filter leaves nothing to learn from).
// RunLoop runs every step's progress through one before on_progress. Not thread-safe.
#ifndef RLFLEET_SERVICES_CONTROLLER_LEARNING_WATCH_H_
#define RLFLEET_SERVICES_CONTROLLER_LEARNING_WATCH_H_

#include <optional>
#include <string>

#include "services/controller/run_loop.h"

namespace rlfleet::controller {

// Steps the entropy must stay under the floor before the policy counts as collapsed.
inline constexpr int kCollapseSteps = 10;

class LearningWatch {
 public:
  // `target`: held-out exact match that ends the run (above 1: none); `floor`: the
  // entropy floor in nats per token (0: no collapse check).
  LearningWatch(double target, double floor) : target_(target), floor_(floor) {}

  // Fills progress->best_exact / best_step / reached_target / goal_step /
  // collapsed_at_step from this step's figures (progress->entropy is the last step
  // that trained). A resumed run's progress carries its earlier figures in. Returns
  // the warning line once, at the step the collapse is found.
  std::optional<std::string> Observe(LoopProgress* progress);

 private:
  const double target_;
  const double floor_;
  int below_since_ = 0;  // first step of the current streak under the floor; 0 = none
  bool warned_ = false;
};

// "policy collapsed at step N: entropy E nats/token under the floor F for K steps while
// held-out exact match is B (best), under the target T; Z% of the groups had no
// reward spread; try ..." (shared by the controller's log and `rlfleet run`).
std::string CollapseLine(int collapsed_at_step, double entropy, double floor, int steps_below, double best_exact,
                         double target, double zero_variance_share);

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_LEARNING_WATCH_H_

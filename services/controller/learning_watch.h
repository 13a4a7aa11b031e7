// What a run's user needs to read its learning: the best held-out score so far,
// whether the run reached its target (LoopConfig::stop_at) and at which step, and
// whether the policy collapsed: over the last kCollapseSteps steps its entropy averaged
// under LoopConfig::entropy_floor and most groups (kCollapseZeroVariance on average) had
// no reward spread, while held-out had never reached the target: a confident policy
// whose groups all score alike, so the zero-variance filter leaves little to learn
// from. (Measured on the demo: a run that stalled at held-out 0.02-0.19 had entropy
// 0.01-0.16 and 75-97% zero-variance groups from step ~140; one that reached 1.0 at
// step 100 went under 0.25 nats only from step ~90, with 35-65% zero-variance groups.)
// RunLoop runs every step's progress through one before on_progress. Not thread-safe.
#ifndef RLFLEET_SERVICES_CONTROLLER_LEARNING_WATCH_H_
#define RLFLEET_SERVICES_CONTROLLER_LEARNING_WATCH_H_

#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "services/controller/run_loop.h"

namespace rlfleet::controller {

// The window of steps the collapse check averages over, and the share of zero-variance
// groups it needs on average.
inline constexpr int kCollapseSteps = 10;
inline constexpr double kCollapseZeroVariance = 0.6;

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
  std::deque<std::pair<int, std::pair<double, double>>> window_;  // step -> (entropy, zero-variance share)
  bool warned_ = false;
};

// "policy collapsed at step N: entropy E nats/token (mean of K steps) under the floor F,
// Z% of the groups with no reward spread, while held-out exact match (best B) is under
// the target T; try ..." (shared by the controller's log and `rlfleet run`).
std::string CollapseLine(int collapsed_at_step, double entropy, double floor, int steps, double best_exact,
                         double target, double zero_variance_share);

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_LEARNING_WATCH_H_

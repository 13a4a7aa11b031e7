#include "services/controller/autoscaler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libs/metrics/metrics.h"

namespace rlfleet::controller {

absl::Status ValidateAutoscaleConfig(const AutoscaleConfig& c) {
  auto bad = [](const std::string& field, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("autoscale ", field, ": ", what));
  };
  if (c.min_replicas < 1 || c.min_replicas > 1024) return bad("min_replicas", "must be in 1..1024");
  if (c.max_replicas < c.min_replicas || c.max_replicas > 1024) {
    return bad("max_replicas", "must be in min_replicas..1024");
  }
  if (c.interval < absl::Milliseconds(10)) return bad("interval", "must be at least 10ms");
  for (const auto& [field, v] : {std::pair<const char*, double>{"up_wait", c.up_wait},
                                 {"up_utilization", c.up_utilization},
                                 {"down_wait", c.down_wait},
                                 {"down_utilization", c.down_utilization}}) {
    if (!(v >= 0 && v <= 1)) return bad(field, "must be in 0..1");
  }
  if (c.down_wait >= c.up_wait) return bad("down_wait", "must be below up_wait (hysteresis)");
  if (c.down_utilization >= c.up_utilization) return bad("down_utilization", "must be below up_utilization");
  if (c.up_samples < 1 || c.down_samples < 1) return bad("up_samples / down_samples", "must be at least 1");
  if (c.cooldown < absl::ZeroDuration()) return bad("cooldown", "must not be negative");
  return absl::OkStatus();
}

absl::Status ParseReplicaBounds(const std::string& text, AutoscaleConfig* config) {
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  int lo = 0, hi = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &lo) || !absl::SimpleAtoi(parts[1], &hi)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not MIN:MAX (e.g. 1:8)"));
  }
  config->min_replicas = lo;
  config->max_replicas = hi;
  return ValidateAutoscaleConfig(*config);
}

void FillRolloutLoad(const std::vector<v1::ReplicaInfo>& replicas, absl::Time now, absl::Duration max_silence,
                     LoadSample* sample) {
  int counted = 0;
  double busy = 0;
  for (const v1::ReplicaInfo& r : replicas) {
    if (r.role() != v1::REPLICA_ROLE_ROLLOUT || !r.admitted()) continue;
    if (now - absl::FromUnixMillis(r.last_heartbeat_unix_ms()) > max_silence) continue;
    const double u = r.load().utilization();
    if (!std::isfinite(u) || u < 0 || u > 1) continue;
    busy += u;
    ++counted;
  }
  sample->replicas = counted;
  sample->utilization = counted > 0 ? busy / counted : 0;
}

int AutoscalePolicy::Next(const LoadSample& s, absl::Time now) {
  const AutoscaleConfig& c = config_;
  if (!desired_) {
    desired_ = std::clamp(s.replicas > 0 ? s.replicas : c.min_replicas, c.min_replicas, c.max_replicas);
    reason_ = absl::StrCat("start at ", *desired_, " (", s.replicas, " registered, bounds ", c.min_replicas, "..",
                           c.max_replicas, ")");
    return *desired_;
  }
  const double wait = std::clamp(s.trainer_wait_fraction, 0.0, 1.0);
  const bool up = s.run_active && wait >= c.up_wait && s.utilization >= c.up_utilization;
  const bool down = !s.run_active || (wait <= c.down_wait && s.utilization <= c.down_utilization);
  up_streak_ = up ? up_streak_ + 1 : 0;
  down_streak_ = down ? down_streak_ + 1 : 0;
  const std::string load =
      s.run_active ? absl::StrFormat("trainer waits %.0f%%, replicas busy %.0f%%", 100 * wait, 100 * s.utilization)
                   : std::string("no active run");
  const absl::Duration cooling = c.cooldown - (now - last_change_);
  if (up && up_streak_ >= c.up_samples && *desired_ < c.max_replicas && cooling <= absl::ZeroDuration()) {
    // Rollouts at a fraction (1 - wait) of the trainer's pace need 1 / (1 - wait) times
    // the replicas: add that (at least one, at most doubling).
    const int add = std::clamp(static_cast<int>(std::floor(*desired_ * wait / std::max(1e-6, 1 - wait))), 1, *desired_);
    const int from = *desired_;
    desired_ = std::min(c.max_replicas, from + add);
    reason_ = absl::StrCat("up ", from, " -> ", *desired_, ": ", load);
  } else if (down && down_streak_ >= c.down_samples && *desired_ > c.min_replicas && cooling <= absl::ZeroDuration()) {
    const int from = *desired_;
    desired_ = from - 1;  // (one at a time: each leaves drained)
    reason_ = absl::StrCat("down ", from, " -> ", *desired_, ": ", load);
  } else {
    const bool wants = (up && *desired_ < c.max_replicas) || (down && *desired_ > c.min_replicas);
    reason_ = absl::StrCat(
        "hold at ", *desired_, ": ", load,
        !wants ? ""
        : cooling > absl::ZeroDuration()
            ? absl::StrCat(" (cooling down ", absl::FormatDuration(absl::Trunc(cooling, absl::Seconds(1))), ")")
            : " (not yet for long enough)");
    return *desired_;
  }
  last_change_ = now;
  up_streak_ = down_streak_ = 0;
  return *desired_;
}

Autoscaler::Autoscaler(AutoscaleConfig config, Sampler sample, Scaler scale, Log log)
    : config_(config),
      sample_(std::move(sample)),
      scale_(std::move(scale)),
      log_(std::move(log)),
      policy_(config),
      thread_([this] { Loop(); }) {}

Autoscaler::~Autoscaler() {
  stop_.Notify();
  thread_.join();
}

void Autoscaler::Loop() {
  static metrics::Gauge* desired_metric =
      metrics::Global().AddGauge("rlfleet_autoscale_rollout_replicas",
                                 "Rollout replicas the autoscaler wants (the signal for an HPA / KEDA).", {});
  static metrics::Gauge* wait_metric =
      metrics::Global().AddGauge("rlfleet_autoscale_trainer_wait_fraction",
                                 "Fraction of the run's last step the trainer waited for rollouts.", {});
  static metrics::Gauge* busy_metric = metrics::Global().AddGauge(
      "rlfleet_autoscale_rollout_utilization", "Mean busy fraction of the registered rollout replicas.", {});
  std::optional<int> set;  // the count last set through scale_
  std::string last_reason;
  do {
    absl::StatusOr<LoadSample> sample = sample_();
    if (!sample.ok()) {
      if (log_) log_(absl::StrCat("autoscale: no load sample: ", sample.status().message()));
      continue;
    }
    const int desired = policy_.Next(*sample, absl::Now());
    desired_metric->Set(desired);
    wait_metric->Set(sample->trainer_wait_fraction);
    busy_metric->Set(sample->utilization);
    if (set == desired) continue;
    if (absl::Status s = scale_(desired); !s.ok()) {
      if (log_ && policy_.reason() != last_reason) {
        log_(absl::StrCat("autoscale: ", policy_.reason(), "; Scale failed: ", s.message()));
      }
      last_reason = policy_.reason();
      continue;
    }
    set = desired;
    last_reason = policy_.reason();
    if (log_) log_(absl::StrCat("autoscale: rollout replicas ", desired, " (", policy_.reason(), ")"));
  } while (!stop_.WaitForNotificationWithTimeout(config_.interval));
}

}  // namespace rlfleet::controller

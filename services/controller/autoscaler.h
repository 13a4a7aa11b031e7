// Closed-loop rollout autoscaling: the number of rollout replicas a run needs, from its
// load, with hysteresis and bounds. The policy is pure (tested with synthetic load);
// Autoscaler samples the controller's registry and active run every interval, applies
// the policy, sets the desired count (ControllerCore::Scale, which the local launcher
// acts on) and exports it as Prometheus gauges (a Kubernetes HPA or KEDA acts on those).
#ifndef RLFLEET_SERVICES_CONTROLLER_AUTOSCALER_H_
#define RLFLEET_SERVICES_CONTROLLER_AUTOSCALER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "rlfleet/v1/common.pb.h"

namespace rlfleet::controller {

struct AutoscaleConfig {
  int min_replicas = 1;
  int max_replicas = 8;
  absl::Duration interval = absl::Seconds(5);  // between samples
  // Scale up when the trainer waits for rollouts at least this fraction of its step
  // and the replicas are busy at least `up_utilization` (more replicas would help).
  double up_wait = 0.25;
  double up_utilization = 0.5;
  // Scale down when no run is active, or when the trainer waits at most `down_wait`
  // and the replicas are busy at most `down_utilization` (they idle).
  double down_wait = 0.05;
  double down_utilization = 0.3;
  // Hysteresis: a signal must hold for this many consecutive samples, and no change
  // follows another within `cooldown` (a new replica needs time to load and warm up).
  int up_samples = 2;
  int down_samples = 4;
  absl::Duration cooldown = absl::Seconds(30);
};

// INVALID_ARGUMENT naming the field for a config out of range.
absl::Status ValidateAutoscaleConfig(const AutoscaleConfig& config);
// "MIN:MAX" (e.g. "1:8") into config's bounds; INVALID_ARGUMENT saying what is wrong.
absl::Status ParseReplicaBounds(const std::string& text, AutoscaleConfig* config);

// One sample of the load.
struct LoadSample {
  bool run_active = false;
  int replicas = 0;                  // rollout replicas registered, admitted and heartbeating now
  double utilization = 0;            // their mean busy fraction, 0..1 (LoadStats.utilization)
  double trainer_wait_fraction = 0;  // of the run's last step: the wait for rollouts / the step's time
};

// A replica whose last heartbeat is older than this is not counted (at the registrar's
// 10 s lease it heartbeats every ~3.3 s: two missed beats and more).
inline constexpr absl::Duration kMaxHeartbeatSilence = absl::Seconds(8);

// Sets sample->replicas and sample->utilization from the registered rollout replicas:
// only those admitted (a verified weight version), whose last heartbeat is within
// `max_silence` of `now` and whose utilization is a finite number in [0, 1] count;
// the others neither count nor move the mean. (The registry refuses such load already;
// this keeps a record it did not check out of the policy.)
void FillRolloutLoad(const std::vector<v1::ReplicaInfo>& replicas, absl::Time now, absl::Duration max_silence,
                     LoadSample* sample);

class AutoscalePolicy {
 public:
  explicit AutoscalePolicy(AutoscaleConfig config) : config_(config) {}
  // The desired replica count after `sample` at `now` (within the bounds). The first
  // call starts from the sample's replica count (clamped).
  int Next(const LoadSample& sample, absl::Time now);
  // Why the last call decided what it did ("up: ...", "down: ...", "hold: ...").
  const std::string& reason() const { return reason_; }

 private:
  const AutoscaleConfig config_;
  std::optional<int> desired_;
  int up_streak_ = 0, down_streak_ = 0;
  absl::Time last_change_ = absl::InfinitePast();
  std::string reason_;
};

// Samples the load every config.interval on its own thread until destroyed, and sets
// the desired count through `scale` when the policy changes it (and on the first
// sample). `scale` errors are logged, and retried at the next change.
class Autoscaler {
 public:
  using Sampler = std::function<absl::StatusOr<LoadSample>()>;
  using Scaler = std::function<absl::Status(int desired)>;
  using Log = std::function<void(const std::string&)>;
  Autoscaler(AutoscaleConfig config, Sampler sample, Scaler scale, Log log);
  ~Autoscaler();
  Autoscaler(const Autoscaler&) = delete;
  Autoscaler& operator=(const Autoscaler&) = delete;

 private:
  void Loop();
  const AutoscaleConfig config_;
  const Sampler sample_;
  const Scaler scale_;
  const Log log_;
  AutoscalePolicy policy_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_AUTOSCALER_H_

// The rollout autoscaling policy under synthetic load: a ramp takes the replicas from
// the minimum to the maximum and back, a spike shorter than the hysteresis changes
// nothing, changes respect the cooldown and the bounds; the sampling thread sets what
// the policy decides.
#include "services/controller/autoscaler.h"

#include <cmath>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace rlfleet::controller {
namespace {

AutoscaleConfig Config() {
  AutoscaleConfig c;
  c.min_replicas = 1;
  c.max_replicas = 6;
  c.up_samples = 2;
  c.down_samples = 3;
  c.cooldown = absl::Seconds(20);
  return c;
}

LoadSample Busy(int replicas, double wait = 0.5) { return {true, replicas, 0.9, wait}; }
LoadSample Idle(int replicas) { return {true, replicas, 0.1, 0.0}; }

v1::ReplicaInfo Rollout(bool admitted, absl::Time heartbeat, double utilization) {
  v1::ReplicaInfo r;
  r.set_role(v1::REPLICA_ROLE_ROLLOUT);
  r.set_admitted(admitted);
  r.set_last_heartbeat_unix_ms(absl::ToUnixMillis(heartbeat));
  r.mutable_load()->set_utilization(utilization);
  return r;
}

TEST(FillRolloutLoad, CountsOnlyAdmittedHeartbeatingReplicasWithSaneLoad) {
  const absl::Time now = absl::FromUnixSeconds(1000000);
  v1::ReplicaInfo reward = Rollout(true, now, 1.0);
  reward.set_role(v1::REPLICA_ROLE_REWARD);
  const std::vector<v1::ReplicaInfo> replicas = {
      Rollout(true, now, 0.8),                      // counted
      Rollout(true, now - absl::Seconds(2), 0.4),   // counted
      Rollout(false, now, 1.0),                     // no verified weights yet
      Rollout(true, now - absl::Seconds(30), 1.0),  // silent for 30 s
      Rollout(true, now, std::nan("")),             // NaN load
      Rollout(true, now, 7.0),                      // out of range
      Rollout(true, now, -1.0),                     // out of range
      reward,                                       // another role
  };
  LoadSample sample;
  FillRolloutLoad(replicas, now, kMaxHeartbeatSilence, &sample);
  EXPECT_EQ(sample.replicas, 2);
  EXPECT_DOUBLE_EQ(sample.utilization, 0.6);

  LoadSample none;
  FillRolloutLoad({Rollout(false, now, 1.0)}, now, kMaxHeartbeatSilence, &none);
  EXPECT_EQ(none.replicas, 0);
  EXPECT_EQ(none.utilization, 0);
}

TEST(AutoscalePolicy, ARampGoesUpToTheMaximumAndBackToTheMinimum) {
  AutoscalePolicy policy(Config());
  absl::Time t = absl::UnixEpoch();
  const absl::Duration tick = absl::Seconds(5);
  EXPECT_EQ(policy.Next(Busy(1), t), 1);  // the start: what is registered
  std::vector<int> trace;
  int replicas = 1;
  // Load rises: the trainer waits half its step for rollouts; the launcher brings the
  // replicas the policy asks for by the next sample.
  for (int i = 0; i < 20; ++i) {
    t += tick;
    replicas = policy.Next(Busy(replicas), t);
    trace.push_back(replicas);
  }
  EXPECT_EQ(replicas, 6) << policy.reason();
  for (size_t i = 1; i < trace.size(); ++i) {
    EXPECT_GE(trace[i], trace[i - 1]);  // only up while the load is high
  }
  EXPECT_EQ(trace[0], 1);  // one sample is not enough (up_samples 2)
  EXPECT_EQ(trace[1], 2);  // wait 0.5: one more for each replica (at most doubling)
  EXPECT_EQ(trace[2], 2);  // then the cooldown (20 s)
  // Load falls: the trainer never waits and the replicas idle.
  for (int i = 0; i < 60; ++i) {
    t += tick;
    const int next = policy.Next(Idle(replicas), t);
    EXPECT_GE(next, replicas - 1);  // one at a time (each leaves drained)
    replicas = next;
  }
  EXPECT_EQ(replicas, 1) << policy.reason();
  // No run: stays at the minimum.
  t += tick;
  EXPECT_EQ(policy.Next({false, 1, 0, 0}, t), 1);
}

TEST(AutoscalePolicy, HysteresisCooldownAndBounds) {
  AutoscaleConfig c = Config();
  c.min_replicas = 2;
  c.max_replicas = 3;
  AutoscalePolicy policy(c);
  absl::Time t = absl::UnixEpoch();
  EXPECT_EQ(policy.Next(Busy(7), t), 3);  // clamped into the bounds at the start
  AutoscalePolicy spikes(Config());
  EXPECT_EQ(spikes.Next(Busy(2), t), 2);
  for (int i = 0; i < 10; ++i) {  // a busy sample between calm ones: never twice in a row
    t += absl::Seconds(5);
    EXPECT_EQ(spikes.Next(i % 2 == 0 ? Busy(2) : LoadSample{true, 2, 0.4, 0.1}, t), 2) << spikes.reason();
  }
  EXPECT_TRUE(absl::StrContains(spikes.reason(), "hold at 2")) << spikes.reason();
  // Busy but the trainer does not wait for rollouts: more replicas would not help.
  for (int i = 0; i < 5; ++i) {
    t += absl::Seconds(5);
    EXPECT_EQ(spikes.Next(Busy(2, /*wait=*/0.1), t), 2);
  }
  // A change, then the cooldown holds the next one and says so.
  t += absl::Seconds(5);
  spikes.Next(Busy(2), t);
  t += absl::Seconds(5);
  EXPECT_EQ(spikes.Next(Busy(2), t), 4);
  t += absl::Seconds(5);
  spikes.Next(Busy(4), t);
  t += absl::Seconds(5);
  EXPECT_EQ(spikes.Next(Busy(4), t), 4);
  EXPECT_TRUE(absl::StrContains(spikes.reason(), "cooling down")) << spikes.reason();
  t += absl::Seconds(15);
  EXPECT_EQ(spikes.Next(Busy(4), t), 6);  // wait 0.5 doubles, to the maximum
}

TEST(AutoscaleConfig, BadBoundsAndThresholdsAreNamed) {
  AutoscaleConfig c;
  EXPECT_TRUE(ParseReplicaBounds("2:8", &c).ok());
  EXPECT_EQ(c.min_replicas, 2);
  EXPECT_EQ(c.max_replicas, 8);
  for (const char* bad : {"8", "3:2", "0:4", "a:b", "1:2000", "1:2:3"}) {
    AutoscaleConfig d;
    EXPECT_EQ(ParseReplicaBounds(bad, &d).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  AutoscaleConfig e;
  e.down_wait = 0.5;
  absl::Status s = ValidateAutoscaleConfig(e);
  EXPECT_TRUE(absl::StrContains(s.message(), "down_wait")) << s;
}

TEST(Autoscaler, SetsWhatThePolicyDecides) {
  AutoscaleConfig c = Config();
  c.interval = absl::Milliseconds(10);
  c.cooldown = absl::ZeroDuration();
  c.up_samples = 1;
  absl::Mutex mu;
  std::vector<int> scaled;
  int replicas = 1;
  {
    Autoscaler autoscaler(
        c,
        [&]() -> absl::StatusOr<LoadSample> {
          absl::MutexLock lock(&mu);
          return Busy(replicas);
        },
        [&](int desired) {
          absl::MutexLock lock(&mu);
          scaled.push_back(desired);
          replicas = desired;
          return absl::OkStatus();
        },
        nullptr);
    absl::MutexLock lock(&mu);
    auto at_max = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return replicas == 6; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&at_max), absl::Seconds(30)));
  }
  ASSERT_GE(scaled.size(), 3u);
  EXPECT_EQ(scaled.front(), 1);  // the first sample sets the start
  EXPECT_EQ(scaled.back(), 6);
}

}  // namespace
}  // namespace rlfleet::controller

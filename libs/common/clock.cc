#include "libs/common/clock.h"

#include "absl/time/clock.h"

namespace rlfleet::common {
namespace {

class RealClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
};

}  // namespace

Clock* Clock::Real() {
  static Clock* const clock = new RealClock();
  return clock;
}

absl::Time FakeClock::Now() {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::SleepFor(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  if (d > absl::ZeroDuration()) {
    now_ += d;
    slept_ += d;
  }
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

absl::Duration FakeClock::total_slept() {
  absl::MutexLock lock(&mu_);
  return slept_;
}

}  // namespace rlfleet::common

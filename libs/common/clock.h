// Time sources. Code that waits or expires things takes a Clock so tests can drive time
// by hand (FakeClock) instead of sleeping.
#ifndef RLFLEET_LIBS_COMMON_CLOCK_H_
#define RLFLEET_LIBS_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rlfleet::common {

// A source of the current time and of sleeps. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  // Blocks the calling thread for `d` of this clock's time.
  virtual void SleepFor(absl::Duration d) = 0;

  // The process-wide wall clock. Never null; not owned by the caller.
  static Clock* Real();
};

// A clock that only moves when told to. SleepFor advances the clock instead of
// blocking, so code under test that backs off or waits runs instantly. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24 * 365 * 56)) : now_(start) {}

  absl::Time Now() override;
  void SleepFor(absl::Duration d) override;
  void Advance(absl::Duration d);
  // Total time requested through SleepFor since construction.
  absl::Duration total_slept();

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  absl::Duration slept_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_CLOCK_H_

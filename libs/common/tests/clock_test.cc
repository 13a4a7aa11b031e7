#include "libs/common/clock.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace rlfleet::common {
namespace {

TEST(FakeClock, MovesOnlyWhenTold) {
  FakeClock clock;
  const absl::Time t0 = clock.Now();
  EXPECT_EQ(clock.Now(), t0);
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(clock.Now(), t0 + absl::Seconds(3));
  clock.SleepFor(absl::Milliseconds(250));
  EXPECT_EQ(clock.Now(), t0 + absl::Milliseconds(3250));
  EXPECT_EQ(clock.total_slept(), absl::Milliseconds(250));
  clock.SleepFor(-absl::Seconds(1));  // negative sleeps are ignored
  EXPECT_EQ(clock.Now(), t0 + absl::Milliseconds(3250));
}

TEST(RealClock, FollowsWallTime) {
  Clock* clock = Clock::Real();
  ASSERT_NE(clock, nullptr);
  EXPECT_EQ(clock, Clock::Real());
  const absl::Time before = absl::Now();
  const absl::Time now = clock->Now();
  EXPECT_GE(now, before);
  EXPECT_LT(now - before, absl::Seconds(5));
}

}  // namespace
}  // namespace rlfleet::common

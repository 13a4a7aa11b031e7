#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/rpc/client.h"

namespace rlfleet::rpc {
namespace {

TEST(Retry, OnlyUnavailableAndDeadlineExceededAreRetryable) {
  EXPECT_TRUE(IsRetryable(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(IsRetryable(absl::StatusCode::kDeadlineExceeded));
  for (auto code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition, absl::StatusCode::kNotFound,
        absl::StatusCode::kUnauthenticated, absl::StatusCode::kResourceExhausted, absl::StatusCode::kInternal}) {
    EXPECT_FALSE(IsRetryable(code)) << code;
  }
}

TEST(Retry, BackoffGrowsExponentiallyIsCappedAndJittered) {
  RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(100);
  policy.max_backoff = absl::Seconds(1);
  policy.multiplier = 2;
  policy.jitter = 0;
  absl::BitGen gen;
  EXPECT_EQ(BackoffFor(policy, 0, gen), absl::Milliseconds(100));
  EXPECT_EQ(BackoffFor(policy, 1, gen), absl::Milliseconds(200));
  EXPECT_EQ(BackoffFor(policy, 3, gen), absl::Milliseconds(800));
  EXPECT_EQ(BackoffFor(policy, 4, gen), absl::Seconds(1));
  EXPECT_EQ(BackoffFor(policy, 500, gen), absl::Seconds(1));  // no overflow

  policy.jitter = 0.2;
  absl::Duration lo = absl::InfiniteDuration(), hi = absl::ZeroDuration();
  for (int i = 0; i < 2000; ++i) {
    absl::Duration d = BackoffFor(policy, 1, gen);
    lo = std::min(lo, d);
    hi = std::max(hi, d);
  }
  EXPECT_GE(lo, absl::Milliseconds(160));
  EXPECT_LE(hi, absl::Milliseconds(240));
  EXPECT_LT(lo, absl::Milliseconds(180));  // the jitter really spreads the values
  EXPECT_GT(hi, absl::Milliseconds(220));
}

TEST(Retry, RetriesUnavailableUntilSuccess) {
  common::FakeClock clock;
  absl::BitGen gen;
  RetryPolicy policy;
  policy.jitter = 0;
  int calls = 0;
  absl::Status s = CallWithRetry(policy, absl::Seconds(10), &clock, gen, [&](absl::Time) {
    return ++calls < 3 ? absl::UnavailableError("down") : absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(clock.total_slept(), absl::Milliseconds(50 + 100));
}

TEST(Retry, DoesNotRetryOtherCodes) {
  common::FakeClock clock;
  absl::BitGen gen;
  int calls = 0;
  absl::Status s = CallWithRetry(RetryPolicy(), absl::Seconds(10), &clock, gen, [&](absl::Time) {
    ++calls;
    return absl::InvalidArgumentError("bad field");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "bad field");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(clock.total_slept(), absl::ZeroDuration());
}

TEST(Retry, StopsAfterMaxAttemptsWithLastError) {
  common::FakeClock clock;
  absl::BitGen gen;
  RetryPolicy policy;
  policy.max_attempts = 3;
  int calls = 0;
  absl::Status s = CallWithRetry(policy, absl::Seconds(100), &clock, gen, [&](absl::Time) {
    ++calls;
    return absl::UnavailableError("still down");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "after 3 attempts")) << s;
  EXPECT_EQ(calls, 3);
}

TEST(Retry, NeverSleepsPastTheOverallDeadline) {
  common::FakeClock clock;
  absl::BitGen gen;
  RetryPolicy policy;
  policy.max_attempts = 100;
  policy.initial_backoff = absl::Milliseconds(300);
  policy.max_backoff = absl::Milliseconds(300);
  policy.jitter = 0;
  const absl::Time start = clock.Now();
  std::vector<absl::Time> deadlines;
  absl::Status s = CallWithRetry(policy, absl::Seconds(1), &clock, gen, [&](absl::Time d) {
    deadlines.push_back(d);
    return absl::DeadlineExceededError("slow");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(deadlines.size(), 4u);  // at 0, 300, 600, 900 ms
  EXPECT_LE(clock.Now() - start, absl::Seconds(1));
  for (absl::Time d : deadlines) EXPECT_EQ(d, start + absl::Seconds(1));
}

TEST(Retry, AttemptTimeoutBoundsEachAttempt) {
  common::FakeClock clock;
  absl::BitGen gen;
  RetryPolicy policy;
  policy.attempt_timeout = absl::Milliseconds(200);
  const absl::Time start = clock.Now();
  absl::Time first;
  int calls = 0;
  absl::Status s = CallWithRetry(policy, absl::Seconds(10), &clock, gen, [&](absl::Time d) {
    if (calls++ == 0) first = d;
    return calls < 2 ? absl::DeadlineExceededError("slow") : absl::OkStatus();
  });
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(first, start + absl::Milliseconds(200));
}

}  // namespace
}  // namespace rlfleet::rpc

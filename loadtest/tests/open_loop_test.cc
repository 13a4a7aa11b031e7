#include "loadtest/open_loop.h"

#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace rlfleet::loadtest {
namespace {

TEST(LatencyHistogram, QuantilesWithinABucketOfTheTruth) {
  LatencyHistogram h;
  for (int us = 1; us <= 10000; ++us) h.Record(absl::Microseconds(us));
  EXPECT_EQ(h.count(), 10000);
  const double p50 = absl::ToDoubleMicroseconds(h.Quantile(0.5));
  const double p99 = absl::ToDoubleMicroseconds(h.Quantile(0.99));
  EXPECT_GE(p50, 5000);
  EXPECT_LE(p50, 5000 * 1.07);
  EXPECT_GE(p99, 9900);
  EXPECT_LE(p99, 10000);  // never above the largest recorded
  EXPECT_EQ(h.Max(), absl::Microseconds(10000));
  EXPECT_EQ(LatencyHistogram().Quantile(0.99), absl::ZeroDuration());
}

TEST(LatencyHistogram, BucketsAreOrderedAndBoundTheirValues) {
  int last = -1;
  for (int64_t us : std::vector<int64_t>{1, 2, 3, 15, 16, 17, 100, 1000, 65535, 1 << 20, int64_t{1} << 26}) {
    const int b = LatencyHistogram::BucketOf(us);
    EXPECT_GE(b, last) << us;
    EXPECT_GE(LatencyHistogram::UpperBoundUs(b), us) << us;
    EXPECT_LE(LatencyHistogram::UpperBoundUs(b), us + us / 16 + 1) << us;
    last = b;
  }
  EXPECT_EQ(LatencyHistogram::BucketOf(int64_t{1} << 40), LatencyHistogram::kBuckets - 1);
}

TEST(RunLevel, AnInstantTargetGetsEveryCallAtTheOfferedRate) {
  LevelOptions options;
  options.qps = 2000;
  options.duration = absl::Milliseconds(500);
  int64_t issued = 0;
  const LevelResult r = RunLevel(options, [&](int64_t index, Done done) {
    EXPECT_EQ(index, issued);
    ++issued;
    done(0);
  });
  EXPECT_EQ(r.due, 1000);
  EXPECT_EQ(r.ok, 1000);
  EXPECT_EQ(r.error_count(), 0);
  // Answers span the level: the achieved rate is the offered one, not a burst's (with
  // room for a sender starved on a loaded CI machine).
  EXPECT_GT(r.achieved_qps, 1000);
  EXPECT_LT(r.achieved_qps, 2600);
}

TEST(RunLevel, ErrorsAreCountedByStatusName) {
  LevelOptions options;
  options.qps = 1000;
  options.duration = absl::Milliseconds(200);
  const LevelResult r = RunLevel(options, [](int64_t index, Done done) {
    if (index % 10 == 3) {
      done(14);  // UNAVAILABLE
    } else if (index % 10 == 7) {
      done(kBadReply);
    } else {
      done(0);
    }
  });
  EXPECT_EQ(r.due, 200);
  EXPECT_EQ(r.errors.at("UNAVAILABLE"), 20);
  EXPECT_EQ(r.errors.at("BAD_REPLY"), 20);
  EXPECT_EQ(r.ok, 160);
  SearchOptions search;
  EXPECT_FALSE(Sustained(r, search));
}

// A sender stalled by one slow call does not hide the stall: the calls due meanwhile
// count their latency from when they were due (a closed loop would report ~0).
TEST(RunLevel, LatencyCountsFromTheDueTimeNotTheSendTime) {
  LevelOptions options;
  options.qps = 1000;
  options.duration = absl::Seconds(1);
  const LevelResult r = RunLevel(options, [](int64_t index, Done done) {
    if (index == 100) absl::SleepFor(absl::Milliseconds(150));  // the sender is stuck here
    done(0);
  });
  EXPECT_EQ(r.ok, 1000);
  EXPECT_GE(r.p99, absl::Milliseconds(60));
  EXPECT_GE(r.max, absl::Milliseconds(140));
  EXPECT_LT(r.p50, absl::Milliseconds(20));
}

// Calls beyond max_outstanding are not sent (CLIENT_BACKLOG); calls still in flight at
// the drain deadline are unanswered; answers that come later are harmless.
TEST(RunLevel, BacklogAndUnansweredCallsAreErrors) {
  LevelOptions options;
  options.qps = 1000;
  options.duration = absl::Milliseconds(100);
  options.max_outstanding = 10;
  options.drain_timeout = absl::Milliseconds(50);
  std::vector<Done> held;
  const LevelResult r = RunLevel(options, [&](int64_t, Done done) { held.push_back(std::move(done)); });
  EXPECT_EQ(r.due, 100);
  EXPECT_EQ(held.size(), 10u);
  EXPECT_EQ(r.errors.at("CLIENT_BACKLOG"), 90);
  EXPECT_EQ(r.unanswered, 10);
  EXPECT_EQ(r.ok, 0);
  for (Done& d : held) d(0);  // after the level: must not crash
}

// A server of one worker taking ~1 ms a call sustains under 1000 calls/s: the search
// finds a capacity that holds and is not above that.
TEST(SearchCapacity, FindsTheCapacityOfAOneWorkerServer) {
  absl::Mutex mu;
  std::deque<Done> queue;
  bool stop = false;
  std::thread worker([&] {
    for (;;) {
      Done next;
      {
        absl::MutexLock lock(&mu);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stop || !queue.empty(); };
        mu.Await(absl::Condition(&ready));
        if (queue.empty()) return;
        next = std::move(queue.front());
        queue.pop_front();
      }
      absl::SleepFor(absl::Milliseconds(1));  // the work
      next(0);
    }
  });
  SearchOptions options;
  options.start_qps = 250;
  options.level_duration = absl::Milliseconds(600);
  options.refinements = 3;
  std::vector<double> offered;
  options.on_level = [&](const LevelResult& l, bool) { offered.push_back(l.offered_qps); };
  const SearchResult found = SearchCapacity(options, [&](int64_t, Done done) {
    absl::MutexLock lock(&mu);
    queue.push_back(std::move(done));
  });
  {
    absl::MutexLock lock(&mu);
    stop = true;
  }
  worker.join();
  EXPECT_GT(found.capacity_qps, 0);  // (below 250 only on a starved machine: the search halves)
  EXPECT_LE(found.capacity_qps, 1000);
  EXPECT_TRUE(Sustained(found.at_capacity, options));
  ASSERT_GE(offered.size(), 3u);  // 250, 500, 1000 (fails), then refinements
  EXPECT_EQ(offered[0], 250);
  EXPECT_EQ(found.levels.size(), offered.size());
}

}  // namespace
}  // namespace rlfleet::loadtest

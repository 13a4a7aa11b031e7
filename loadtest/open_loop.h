// An open-loop load generator: calls start at a fixed arrival rate whatever the server
// does (a closed loop, which waits for replies, slows down with the server and hides its
// queueing), and each call's latency counts from the moment it was due, not from when it
// was sent, so a stalled sender does not hide the stall (coordinated omission).
//
// RunLevel offers one rate for a while; SearchCapacity finds the highest rate a target
// sustains: every call answered OK, the answers keeping up with the offered rate, and
// p99 under a bound. Targets are plain functions that start one asynchronous call and
// report its status code when it ends, so the same driver measures a real service and
// a bare gRPC echo of the same message shapes.
//
// Thread-safe: a LatencyHistogram takes Record from any thread; RunLevel blocks its
// caller and calls `issue` from one sender thread.
#ifndef RLFLEET_LOADTEST_OPEN_LOOP_H_
#define RLFLEET_LOADTEST_OPEN_LOOP_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace rlfleet::loadtest {

// Latencies in log-linear buckets: 16 per power of two from 1 us (precision ~4.4%),
// up to ~2^27 us (134 s); longer ones land in the last bucket.
class LatencyHistogram {
 public:
  static constexpr int kSubBuckets = 16;
  static constexpr int kPowers = 28;
  static constexpr int kBuckets = kSubBuckets * kPowers;

  LatencyHistogram();
  void Record(absl::Duration latency);
  int64_t count() const { return count_.load(std::memory_order_relaxed); }
  // The upper bound of the bucket holding the q-quantile (0 < q <= 1); zero when empty.
  absl::Duration Quantile(double q) const;
  absl::Duration Max() const { return absl::Microseconds(max_us_.load(std::memory_order_relaxed)); }

  // Bucket of a latency in microseconds, and a bucket's upper bound (exposed for tests).
  static int BucketOf(int64_t us);
  static int64_t UpperBoundUs(int bucket);

 private:
  std::array<std::atomic<int64_t>, kBuckets> buckets_;
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> max_us_{0};
};

// The code a caller reports for an OK reply that says the call did not do its work
// (a Put whose experiences were not all accepted, a stream without its end): "BAD_REPLY".
inline constexpr int kBadReply = 100;

// Starts one call; the call must run `done` exactly once, with its gRPC status code
// (0 = OK) and from any thread, when it ends. `index` counts the calls of a level from 0.
using Done = std::function<void(int code)>;
using IssueFn = std::function<void(int64_t index, Done done)>;

struct LevelOptions {
  double qps = 1000;
  absl::Duration duration = absl::Seconds(2);
  // Calls in flight at most; a call due while this many are in flight is not sent and
  // counts as an error ("client backlog"): the target is not keeping up.
  int max_outstanding = 8192;
  // How long the level waits, after the last call was due, for the calls in flight.
  absl::Duration drain_timeout = absl::Seconds(15);
};

struct LevelResult {
  double offered_qps = 0;
  double achieved_qps = 0;  // calls answered OK per second, first due to last answered
  int64_t due = 0;          // calls due in the level
  int64_t ok = 0;
  int64_t unanswered = 0;                 // still in flight when the drain timed out
  std::map<std::string, int64_t> errors;  // by gRPC status code name (and "CLIENT_BACKLOG")
  absl::Duration p50, p99, p999, max;     // of the calls answered OK, from when each was due
  int64_t error_count() const;
};

// Offers options.qps for options.duration. `issue` is called from this thread only.
LevelResult RunLevel(const LevelOptions& options, const IssueFn& issue);

struct SearchOptions {
  double start_qps = 500;
  double max_qps = 200000;
  absl::Duration level_duration = absl::Seconds(2);
  // A level is sustained when no call failed, achieved >= min_achieved x offered and
  // p99 <= max_p99.
  double min_achieved = 0.95;
  absl::Duration max_p99 = absl::Milliseconds(50);
  // After the first failing rate, this many bisections (geometric) between the last
  // sustained and the first failing one.
  int refinements = 4;
  int max_outstanding = 8192;
  // Called before each level (e.g. to let the target work off what an overloaded
  // level left queued, so that each level starts from the same state); may be empty.
  std::function<void()> before_level;
  // Told each level's result as it ends (progress output); may be empty.
  std::function<void(const LevelResult&, bool sustained)> on_level;
};

struct SearchResult {
  double capacity_qps = 0;          // the highest sustained rate (0: not even start_qps)
  LevelResult at_capacity;          // that level's figures
  std::vector<LevelResult> levels;  // every level run, in order
};

bool Sustained(const LevelResult& level, const SearchOptions& options);

// Doubles from start_qps until a level is not sustained (or max_qps), then refines.
SearchResult SearchCapacity(const SearchOptions& options, const IssueFn& issue);

}  // namespace rlfleet::loadtest

#endif  // RLFLEET_LOADTEST_OPEN_LOOP_H_

#include "loadtest/open_loop.h"

#include <sys/prctl.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace rlfleet::loadtest {
namespace {

// gRPC's status code names (grpc::StatusCode's values, 0..16).
std::string CodeName(int code) {
  static const char* const kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  if (code >= 0 && code < static_cast<int>(std::size(kNames))) return kNames[code];
  if (code == kBadReply) return "BAD_REPLY";
  return "CODE_" + std::to_string(code);
}

// What the calls of one level share; held by every call's `done`, so a call that ends
// after its level gave up waiting still finds it.
struct LevelState {
  LatencyHistogram latency;
  std::atomic<int64_t> ok{0};
  std::atomic<int64_t> last_answer_us{0};  // since the level's start
  absl::Mutex mu;
  int64_t in_flight ABSL_GUARDED_BY(mu) = 0;
  std::map<std::string, int64_t> errors ABSL_GUARDED_BY(mu);
};

}  // namespace

LatencyHistogram::LatencyHistogram() {
  for (auto& b : buckets_) b.store(0, std::memory_order_relaxed);
}

int LatencyHistogram::BucketOf(int64_t us) {
  if (us < 1) us = 1;
  // Power p: 2^p <= us < 2^(p+1); sub-bucket: the 4 bits below the leading one.
  const int p = 63 - __builtin_clzll(static_cast<uint64_t>(us));
  if (p >= kPowers) return kBuckets - 1;
  const int sub = p >= 4 ? static_cast<int>((us >> (p - 4)) & 15) : static_cast<int>((us << (4 - p)) & 15);
  return p * kSubBuckets + sub;
}

int64_t LatencyHistogram::UpperBoundUs(int bucket) {
  const int p = bucket / kSubBuckets;
  const int sub = bucket % kSubBuckets;
  // Bucket (p, sub) holds [2^p (1 + sub/16), 2^p (1 + (sub+1)/16)).
  const double upper = std::ldexp(1.0 + (sub + 1) / 16.0, p);
  return static_cast<int64_t>(std::ceil(upper));
}

void LatencyHistogram::Record(absl::Duration latency) {
  const int64_t us = std::max<int64_t>(0, absl::ToInt64Microseconds(latency));
  buckets_[BucketOf(us)].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  int64_t seen = max_us_.load(std::memory_order_relaxed);
  while (us > seen && !max_us_.compare_exchange_weak(seen, us, std::memory_order_relaxed)) {
  }
}

absl::Duration LatencyHistogram::Quantile(double q) const {
  const int64_t n = count();
  if (n == 0) return absl::ZeroDuration();
  const auto rank = static_cast<int64_t>(std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(n)));
  int64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += buckets_[b].load(std::memory_order_relaxed);
    if (seen >= std::max<int64_t>(rank, 1)) {
      return absl::Microseconds(std::min(UpperBoundUs(b), max_us_.load(std::memory_order_relaxed)));
    }
  }
  return Max();
}

int64_t LevelResult::error_count() const {
  int64_t n = unanswered;
  for (const auto& [name, count] : errors) n += count;
  return n;
}

LevelResult RunLevel(const LevelOptions& options, const IssueFn& issue) {
  // The sender sleeps to each due time; the kernel's default 50 us timer slack would add
  // to every latency it measures.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  auto state = std::make_shared<LevelState>();
  const int64_t due_count = std::max<int64_t>(1, std::llround(options.qps * absl::ToDoubleSeconds(options.duration)));
  const double interval_us = 1e6 / options.qps;
  const absl::Time start = absl::Now() + absl::Milliseconds(1);
  int64_t backlog = 0;

  for (int64_t i = 0; i < due_count;) {
    const absl::Time due = start + absl::Microseconds(static_cast<int64_t>(static_cast<double>(i) * interval_us));
    const absl::Time now = absl::Now();
    if (due > now) {
      absl::SleepFor(due - now);
      continue;
    }
    // Every call due by now goes out, each timed from its own due time.
    for (; i < due_count; ++i) {
      const absl::Time call_due =
          start + absl::Microseconds(static_cast<int64_t>(static_cast<double>(i) * interval_us));
      if (call_due > now) break;
      {
        absl::MutexLock lock(&state->mu);
        if (state->in_flight >= options.max_outstanding) {
          ++backlog;
          continue;
        }
        ++state->in_flight;
      }
      issue(i, [state, call_due, start](int code) {
        const absl::Time answered = absl::Now();
        if (code == 0) {
          state->latency.Record(answered - call_due);
          state->ok.fetch_add(1, std::memory_order_relaxed);
          const int64_t at = absl::ToInt64Microseconds(answered - start);
          int64_t last = state->last_answer_us.load(std::memory_order_relaxed);
          while (at > last && !state->last_answer_us.compare_exchange_weak(last, at, std::memory_order_relaxed)) {
          }
        }
        absl::MutexLock lock(&state->mu);
        if (code != 0) ++state->errors[CodeName(code)];
        --state->in_flight;
      });
    }
  }

  LevelResult result;
  result.offered_qps = options.qps;
  result.due = due_count;
  const absl::Time last_due =
      start + absl::Microseconds(static_cast<int64_t>(static_cast<double>(due_count - 1) * interval_us));
  {
    absl::MutexLock lock(&state->mu);
    auto idle = [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) { return state->in_flight == 0; };
    state->mu.AwaitWithDeadline(absl::Condition(&idle), last_due + options.drain_timeout);
    result.unanswered = state->in_flight;
    result.errors = state->errors;
  }
  if (backlog > 0) result.errors["CLIENT_BACKLOG"] = backlog;
  result.ok = state->ok.load();
  const double span_s = std::max(1e-6, state->last_answer_us.load() / 1e6);
  result.achieved_qps = static_cast<double>(result.ok) / span_s;
  result.p50 = state->latency.Quantile(0.5);
  result.p99 = state->latency.Quantile(0.99);
  result.p999 = state->latency.Quantile(0.999);
  result.max = state->latency.Max();
  return result;
}

bool Sustained(const LevelResult& level, const SearchOptions& options) {
  return level.error_count() == 0 && level.achieved_qps >= options.min_achieved * level.offered_qps &&
         level.p99 <= options.max_p99;
}

SearchResult SearchCapacity(const SearchOptions& options, const IssueFn& issue) {
  SearchResult result;
  auto run = [&](double qps) {
    LevelOptions level;
    level.qps = qps;
    level.duration = options.level_duration;
    level.max_outstanding = options.max_outstanding;
    if (options.before_level) options.before_level();
    LevelResult r = RunLevel(level, issue);
    const bool ok = Sustained(r, options);
    if (options.on_level) options.on_level(r, ok);
    result.levels.push_back(r);
    if (ok && qps > result.capacity_qps) {
      result.capacity_qps = qps;
      result.at_capacity = r;
    }
    return ok;
  };
  double good = 0;
  double bad = 0;
  for (double qps = options.start_qps;; qps *= 2) {
    if (qps > options.max_qps) break;
    if (!run(qps)) {
      bad = qps;
      break;
    }
    good = qps;
  }
  if (bad == 0) return result;  // sustained up to max_qps
  // Failed at the first rate: halve (up to 6 times) to find one that holds.
  for (double qps = options.start_qps / 2; good == 0 && qps >= options.start_qps / 64; qps /= 2) {
    if (run(qps)) {
      good = qps;
    } else {
      bad = qps;
    }
  }
  if (good == 0) return result;
  for (int i = 0; i < options.refinements; ++i) {
    const double mid = std::sqrt(good * bad);
    if (run(mid)) {
      good = mid;
    } else {
      bad = mid;
    }
  }
  return result;
}

}  // namespace rlfleet::loadtest

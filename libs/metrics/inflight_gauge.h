// InflightGauge: a count of work in flight (queued sequences, open streams, leases)
// exported as a Prometheus gauge, with one owner that pairs every Add with a Remove.
//
// Each instance keeps its own count and adds its changes to the process's gauge series
// (several instances in one process, e.g. two cores in a test, sum there; none
// overwrites another's). A Remove that would take the count below zero is a pairing
// bug (a path that retires the same work twice): the count stops at zero, the
// process's `rlfleet_inflight_underflows_total{gauge="<name>"}` counts it and the first
// few are logged to stderr, so a dashboard never shows a negative queue and the bug is
// still visible. Thread-safe.
#ifndef RLFLEET_LIBS_METRICS_INFLIGHT_GAUGE_H_
#define RLFLEET_LIBS_METRICS_INFLIGHT_GAUGE_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "libs/metrics/metrics.h"

namespace rlfleet::metrics {

class InflightGauge {
 public:
  // The gauge `name` (help `help`, no labels) in `registry`.
  InflightGauge(const std::string& name, const std::string& help, Registry& registry = Global());
  // Gives back what this instance still counts (the owner is gone, so is its work).
  ~InflightGauge();
  InflightGauge(const InflightGauge&) = delete;
  InflightGauge& operator=(const InflightGauge&) = delete;

  // `n` (>= 0) units started.
  void Add(int64_t n = 1);
  // `n` (>= 0) units ended. Past zero: an underflow (see the class comment).
  void Remove(int64_t n = 1);
  // Follows a count that another structure owns (a batch's size): adds the difference.
  void Set(int64_t n);
  // This instance's count.
  int64_t value() const;
  // Removes that would have taken this instance below zero.
  int64_t underflows() const;
  // The process's underflow counter of gauge `name` (every instance of that name).
  static double UnderflowsOf(const std::string& name, Registry& registry = Global());

 private:
  const std::string name_;
  Gauge* const gauge_;
  Counter* const underflow_metric_;
  mutable absl::Mutex mu_;
  int64_t value_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t underflows_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rlfleet::metrics

#endif  // RLFLEET_LIBS_METRICS_INFLIGHT_GAUGE_H_

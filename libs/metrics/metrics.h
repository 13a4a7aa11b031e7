// Prometheus metrics for every rlfleet service: counters, gauges (set, or read from a
// callback at scrape time) and histograms, with labels, rendered in Prometheus's text
// exposition format (0.0.4). A process has one Registry (Global()); each service adds
// its metrics to it, and libs/rpc's ServerRunner serves it at /metrics over HTTP.
//
//   auto* tokens = metrics::Global().AddCounter("rlfleet_rollout_tokens_total",
//                                               "Tokens decoded.", {});
//   tokens->Add(n);
//
// Thread-safe. Metrics live as long as the registry (never removed).
#ifndef RLFLEET_LIBS_METRICS_METRICS_H_
#define RLFLEET_LIBS_METRICS_METRICS_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rlfleet::metrics {

using Labels = std::map<std::string, std::string>;

class Counter {
 public:
  void Add(double v = 1);
  double value() const;

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v);
  void Add(double v);
  double value() const;

 private:
  std::atomic<double> value_{0};
};

// Cumulative buckets (le), a sum and a count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Bucket counts (cumulative, one per bound then +Inf), sum, count.
  void Snapshot(std::vector<uint64_t>* cumulative, double* sum, uint64_t* count);

 private:
  const std::vector<double> bounds_;
  absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket (not cumulative), +Inf last
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

// Latency buckets in seconds, 1 ms .. 60 s.
std::vector<double> LatencyBuckets();

class Registry {
 public:
  // The same name and labels return the same metric. Names follow Prometheus rules
  // ([a-zA-Z_:][a-zA-Z0-9_:]*); one name has one type and help.
  Counter* AddCounter(const std::string& name, const std::string& help, const Labels& labels);
  Gauge* AddGauge(const std::string& name, const std::string& help, const Labels& labels);
  Histogram* AddHistogram(const std::string& name, const std::string& help, const Labels& labels,
                          std::vector<double> bounds = LatencyBuckets());
  // A gauge whose value `read` returns at every scrape (e.g. a queue's depth).
  void AddCallbackGauge(const std::string& name, const std::string& help, const Labels& labels,
                        std::function<double()> read);
  // A counter read at every scrape (e.g. bytes from /sys/class/net).
  void AddCallbackCounter(const std::string& name, const std::string& help, const Labels& labels,
                          std::function<double()> read);

  // The text exposition of every metric, families sorted by name.
  std::string Render();

 private:
  struct Series {
    Labels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
    std::function<double()> read;
  };
  struct Family {
    std::string type;  // counter, gauge, histogram
    std::string help;
    std::vector<std::unique_ptr<Series>> series;
  };
  Series* Find(const std::string& name, const std::string& type, const std::string& help, const Labels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

// The process's registry.
Registry& Global();

// Process and host metrics every service exports: uptime, resident memory, CPU
// seconds, and per network interface (from /sys/class/net) bytes, packets, errors and
// drops received and sent, and the link speed. Call once per process.
void AddProcessMetrics(Registry& registry, const std::string& service);

}  // namespace rlfleet::metrics

#endif  // RLFLEET_LIBS_METRICS_METRICS_H_

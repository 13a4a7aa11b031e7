#include "libs/metrics/metrics.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"

namespace rlfleet::metrics {
namespace {

void AtomicAdd(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrFormat("%.15g", v);  // (StrCat keeps 6 digits: a Unix time would lose minutes)
}

std::string EscapeLabel(const std::string& v) {
  return absl::StrReplaceAll(v, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

// {a="1",b="2"} with `extra` (le) last; empty for no labels.
std::string LabelText(const Labels& labels, const std::string& extra_key = "", const std::string& extra = "") {
  std::vector<std::string> parts;
  for (const auto& [k, v] : labels) parts.push_back(absl::StrCat(k, "=\"", EscapeLabel(v), "\""));
  if (!extra_key.empty()) parts.push_back(absl::StrCat(extra_key, "=\"", extra, "\""));
  return parts.empty() ? "" : absl::StrCat("{", absl::StrJoin(parts, ","), "}");
}

double ReadNumber(const std::string& path) {
  std::ifstream in(path);
  double v = 0;
  in >> v;
  return in ? v : 0;
}

}  // namespace

void Counter::Add(double v) { AtomicAdd(value_, v); }
double Counter::value() const { return value_.load(std::memory_order_relaxed); }
void Gauge::Set(double v) { value_.store(v, std::memory_order_relaxed); }
void Gauge::Add(double v) { AtomicAdd(value_, v); }
double Gauge::value() const { return value_.load(std::memory_order_relaxed); }

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  absl::MutexLock lock(&mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Snapshot(std::vector<uint64_t>* cumulative, double* sum, uint64_t* count) {
  absl::MutexLock lock(&mu_);
  cumulative->assign(counts_.size(), 0);
  uint64_t running = 0;
  for (size_t i = 0; i < counts_.size(); ++i) (*cumulative)[i] = running += counts_[i];
  *sum = sum_;
  *count = count_;
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

Registry::Series* Registry::Find(const std::string& name, const std::string& type, const std::string& help,
                                 const Labels& labels) {
  Family& f = families_[name];
  if (f.type.empty()) {
    f.type = type;
    f.help = help;
  }
  for (auto& s : f.series) {
    if (s->labels == labels) return s.get();
  }
  f.series.push_back(std::make_unique<Series>());
  f.series.back()->labels = labels;
  return f.series.back().get();
}

Counter* Registry::AddCounter(const std::string& name, const std::string& help, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Series* s = Find(name, "counter", help, labels);
  if (!s->counter) s->counter = std::make_unique<Counter>();
  return s->counter.get();
}

Gauge* Registry::AddGauge(const std::string& name, const std::string& help, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Series* s = Find(name, "gauge", help, labels);
  if (!s->gauge) s->gauge = std::make_unique<Gauge>();
  return s->gauge.get();
}

Histogram* Registry::AddHistogram(const std::string& name, const std::string& help, const Labels& labels,
                                  std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  Series* s = Find(name, "histogram", help, labels);
  if (!s->histogram) s->histogram = std::make_unique<Histogram>(std::move(bounds));
  return s->histogram.get();
}

void Registry::AddCallbackGauge(const std::string& name, const std::string& help, const Labels& labels,
                                std::function<double()> read) {
  absl::MutexLock lock(&mu_);
  Find(name, "gauge", help, labels)->read = std::move(read);
}

void Registry::AddCallbackCounter(const std::string& name, const std::string& help, const Labels& labels,
                                  std::function<double()> read) {
  absl::MutexLock lock(&mu_);
  Find(name, "counter", help, labels)->read = std::move(read);
}

std::string Registry::Render() {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    absl::StrAppend(&out, "# HELP ", name, " ", absl::StrReplaceAll(f.help, {{"\\", "\\\\"}, {"\n", "\\n"}}), "\n");
    absl::StrAppend(&out, "# TYPE ", name, " ", f.type, "\n");
    for (const auto& s : f.series) {
      if (s->histogram) {
        std::vector<uint64_t> cumulative;
        double sum = 0;
        uint64_t count = 0;
        s->histogram->Snapshot(&cumulative, &sum, &count);
        const auto& bounds = s->histogram->bounds();
        for (size_t i = 0; i < cumulative.size(); ++i) {
          const std::string le = i < bounds.size() ? FormatValue(bounds[i]) : "+Inf";
          absl::StrAppend(&out, name, "_bucket", LabelText(s->labels, "le", le), " ", cumulative[i], "\n");
        }
        absl::StrAppend(&out, name, "_sum", LabelText(s->labels), " ", FormatValue(sum), "\n");
        absl::StrAppend(&out, name, "_count", LabelText(s->labels), " ", count, "\n");
        continue;
      }
      const double v = s->read ? s->read() : s->counter ? s->counter->value() : s->gauge ? s->gauge->value() : 0;
      absl::StrAppend(&out, name, LabelText(s->labels), " ", FormatValue(v), "\n");
    }
  }
  return out;
}

Registry& Global() {
  static Registry* registry = new Registry();
  return *registry;
}

void AddProcessMetrics(Registry& registry, const std::string& service) {
  const absl::Time start = absl::Now();
  const Labels labels = {{"service", service}};
  registry.AddCallbackGauge("rlfleet_up", "1 while the service runs.", labels, [] { return 1.0; });
  registry.AddCallbackGauge("rlfleet_time_seconds",
                            "This host's clock (Unix seconds) when scraped: "
                            "rlfleet doctor --fleet compares it across replicas.",
                            labels, [] { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); });
  registry.AddCallbackGauge("rlfleet_process_uptime_seconds", "Seconds since the process started.", labels,
                            [start] { return absl::ToDoubleSeconds(absl::Now() - start); });
  registry.AddCallbackGauge("rlfleet_process_resident_memory_bytes", "Resident memory of the process.", labels, [] {
    std::ifstream statm("/proc/self/statm");
    double size = 0, resident = 0;
    statm >> size >> resident;
    return resident * sysconf(_SC_PAGESIZE);
  });
  registry.AddCallbackCounter("rlfleet_process_cpu_seconds_total", "User + system CPU time of the process.", labels,
                              [] {
                                std::ifstream stat("/proc/self/stat");
                                std::string field;
                                double utime = 0, stime = 0;
                                for (int i = 1; i <= 15 && stat >> field; ++i) {
                                  if (i == 14) utime = std::atof(field.c_str());
                                  if (i == 15) stime = std::atof(field.c_str());
                                }
                                return (utime + stime) / sysconf(_SC_CLK_TCK);
                              });
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/class/net", ec)) {
    const std::string dev = entry.path().filename().string();
    const std::string stats = entry.path().string() + "/statistics/";
    const Labels nic = {{"service", service}, {"device", dev}};
    const std::pair<const char*, const char*> counters[] = {
        {"rx_bytes", "rlfleet_nic_receive_bytes_total"},   {"tx_bytes", "rlfleet_nic_transmit_bytes_total"},
        {"rx_errors", "rlfleet_nic_receive_errors_total"}, {"tx_errors", "rlfleet_nic_transmit_errors_total"},
        {"rx_dropped", "rlfleet_nic_receive_drops_total"}, {"tx_dropped", "rlfleet_nic_transmit_drops_total"}};
    for (const auto& [file, name] : counters) {
      registry.AddCallbackCounter(name, absl::StrCat("/sys/class/net/<device>/statistics/", file, "."), nic,
                                  [path = stats + file] { return ReadNumber(path); });
    }
    registry.AddCallbackGauge("rlfleet_nic_speed_bytes_per_second",
                              "Link speed from /sys/class/net/<device>/speed (Mb/s) in bytes/s; 0 if unknown.", nic,
                              [path = entry.path().string() + "/speed"] {
                                const double mbps = ReadNumber(path);
                                return mbps > 0 ? mbps * 1e6 / 8 : 0;
                              });
  }
}

}  // namespace rlfleet::metrics

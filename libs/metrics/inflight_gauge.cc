#include "libs/metrics/inflight_gauge.h"

#include <iostream>

namespace rlfleet::metrics {
namespace {

constexpr char kUnderflows[] = "rlfleet_inflight_underflows_total";
constexpr char kUnderflowsHelp[] =
    "Decrements of an in-flight gauge that would have taken it below zero (a path that retired the same work "
    "twice: a bug; the gauge stopped at zero).";
constexpr int64_t kLoggedUnderflows = 5;  // per instance

}  // namespace

InflightGauge::InflightGauge(const std::string& name, const std::string& help, Registry& registry)
    : name_(name),
      gauge_(registry.AddGauge(name, help, {})),
      underflow_metric_(registry.AddCounter(kUnderflows, kUnderflowsHelp, {{"gauge", name}})) {}

InflightGauge::~InflightGauge() {
  absl::MutexLock lock(&mu_);
  gauge_->Add(-static_cast<double>(value_));
}

void InflightGauge::Add(int64_t n) {
  if (n <= 0) return;
  absl::MutexLock lock(&mu_);
  value_ += n;
  gauge_->Add(static_cast<double>(n));
}

void InflightGauge::Remove(int64_t n) {
  if (n <= 0) return;
  int64_t missing = 0, count = 0;
  {
    absl::MutexLock lock(&mu_);
    if (n > value_) {
      missing = n - value_;
      n = value_;
      count = ++underflows_;
    }
    value_ -= n;
    gauge_->Add(-static_cast<double>(n));
  }
  if (missing == 0) return;
  underflow_metric_->Add();
  if (count <= kLoggedUnderflows) {
    std::cerr << "rlfleet: in-flight gauge " << name_ << " would have gone " << missing
              << " below zero (work retired twice: a bug); it stays at 0\n";
  }
}

void InflightGauge::Set(int64_t n) {
  if (n < 0) n = 0;
  absl::MutexLock lock(&mu_);
  gauge_->Add(static_cast<double>(n - value_));
  value_ = n;
}

int64_t InflightGauge::value() const {
  absl::MutexLock lock(&mu_);
  return value_;
}

int64_t InflightGauge::underflows() const {
  absl::MutexLock lock(&mu_);
  return underflows_;
}

double InflightGauge::UnderflowsOf(const std::string& name, Registry& registry) {
  return registry.AddCounter(kUnderflows, kUnderflowsHelp, {{"gauge", name}})->value();
}

}  // namespace rlfleet::metrics

#include "libs/dist/metered_group.h"

#include "absl/time/clock.h"
#include "libs/metrics/metrics.h"

namespace rlfleet::dist {

struct MeteredGroup::Meters {
  metrics::Histogram* seconds;
  metrics::Counter* bytes;
};

MeteredGroup::MeteredGroup(std::unique_ptr<GradientGroup> inner, const std::string& backend)
    : inner_(std::move(inner)),
      meters_(new Meters{
          metrics::Global().AddHistogram("rlfleet_dp_allreduce_seconds",
                                         "Gradient all-reduce time per call (data-parallel ranks).",
                                         {{"backend", backend}}),
          metrics::Global().AddCounter("rlfleet_dp_allreduce_bytes_total", "Bytes all-reduced (data-parallel ranks).",
                                       {{"backend", backend}})}) {}

MeteredGroup::~MeteredGroup() = default;

absl::Status MeteredGroup::AllReduceSum(float* data, size_t n) {
  const absl::Time start = absl::Now();
  absl::Status s = inner_->AllReduceSum(data, n);
  meters_->seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  meters_->bytes->Add(n * sizeof(float));
  return s;
}

}  // namespace rlfleet::dist

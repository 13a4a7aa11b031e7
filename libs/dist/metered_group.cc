#include "libs/dist/metered_group.h"

#include "absl/time/clock.h"
#include "libs/metrics/metrics.h"

namespace rlfleet::dist {

MeteredGroup::MeteredGroup(std::unique_ptr<GradientGroup> inner, const std::string& backend)
    : inner_(std::move(inner)),
      seconds_(metrics::Global().AddHistogram("rlfleet_dp_allreduce_seconds",
                                              "Gradient all-reduce time per call (data-parallel ranks).",
                                              {{"backend", backend}})),
      bytes_(metrics::Global().AddCounter("rlfleet_dp_allreduce_bytes_total",
                                          "Bytes all-reduced (data-parallel ranks).", {{"backend", backend}})) {}

absl::Status MeteredGroup::AllReduceSum(float* data, size_t n) {
  const absl::Time start = absl::Now();
  absl::Status s = inner_->AllReduceSum(data, n);
  seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  bytes_->Add(n * sizeof(float));
  return s;
}

}  // namespace rlfleet::dist

// MeteredGroup: a GradientGroup that records every all-reduce of another one in the
// process's metrics (rlfleet_dp_allreduce_seconds / _bytes_total{backend=...}).
// Backends built into a shared library of their own (librlfleet_gloo.so) cannot
// record there themselves: that library has its own copy of the metrics registry,
// which nothing serves. So the service wraps them.
#ifndef RLFLEET_LIBS_DIST_METERED_GROUP_H_
#define RLFLEET_LIBS_DIST_METERED_GROUP_H_

#include <memory>
#include <string>

#include "libs/dist/gradient_group.h"

namespace rlfleet::metrics {
class Counter;
class Histogram;
}  // namespace rlfleet::metrics

namespace rlfleet::dist {

class MeteredGroup : public GradientGroup {
 public:
  // `backend`: the label value (e.g. "gloo").
  MeteredGroup(std::unique_ptr<GradientGroup> inner, const std::string& backend);

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status Broadcast(std::string* bytes) override { return inner_->Broadcast(bytes); }

 private:
  std::unique_ptr<GradientGroup> inner_;
  metrics::Histogram* const seconds_;  // (the process's registry owns both)
  metrics::Counter* const bytes_;
};

}  // namespace rlfleet::dist

#endif  // RLFLEET_LIBS_DIST_METERED_GROUP_H_

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

namespace rlfleet::dist {

class MeteredGroup : public GradientGroup {
 public:
  // `backend`: the label value (e.g. "gloo").
  MeteredGroup(std::unique_ptr<GradientGroup> inner, const std::string& backend);
  ~MeteredGroup() override;

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status Broadcast(std::string* bytes) override { return inner_->Broadcast(bytes); }

 private:
  struct Meters;
  std::unique_ptr<GradientGroup> inner_;
  std::unique_ptr<Meters> meters_;
};

}  // namespace rlfleet::dist

#endif  // RLFLEET_LIBS_DIST_METERED_GROUP_H_

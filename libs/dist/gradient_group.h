// GradientGroup: the seam between a model's training step and data parallelism. Each
// rank of a model trains on its part of every batch, and after each backward pass the
// ranks' gradients are combined, weighted by their response tokens, so that a step
// equals one rank training on the whole batch (token-mean losses). libs/model calls
// it; the backends live beside it in libs/dist (Gloo over TCP; the ring / hierarchical
// all-reduce over libs/transport). No dependencies: the model does not reach into the
// backends, and the backends do not depend on the model.
#ifndef RLFLEET_LIBS_DIST_GRADIENT_GROUP_H_
#define RLFLEET_LIBS_DIST_GRADIENT_GROUP_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace rlfleet::dist {

class GradientGroup {
 public:
  virtual ~GradientGroup() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Sums `data` (host memory) element-wise over the ranks, in place. Every rank calls
  // it with the same n in the same order. UNAVAILABLE / DEADLINE_EXCEEDED when a rank
  // is gone or stuck: an error within the group's timeout, never a hang.
  virtual absl::Status AllReduceSum(float* data, size_t n) = 0;
  // Rank 0 sends `bytes` to every rank (the others' `bytes` are replaced): how rank 0
  // hands out work. Errors as AllReduceSum.
  virtual absl::Status Broadcast(std::string* bytes) = 0;
};

}  // namespace rlfleet::dist

#endif  // RLFLEET_LIBS_DIST_GRADIENT_GROUP_H_

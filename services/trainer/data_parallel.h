// The trainer's data-parallel group from its --dp_* flags: with world > 1, rank 0
// serves the rendezvous and every rank joins a Gloo group, which carries the
// gradients itself (--dp_allreduce=gloo) or bootstraps libs/dist's ring or
// hierarchical all-reduce over the data plane (ring, hierarchical) in fp32 or a
// narrower wire precision (--dp_wire).
#ifndef RLFLEET_SERVICES_TRAINER_DATA_PARALLEL_H_
#define RLFLEET_SERVICES_TRAINER_DATA_PARALLEL_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/dist/gloo_group.h"
#include "libs/model/policy.h"

namespace rlfleet::trainer {

struct DataParallelOptions {
  int world = 1;
  int rank = 0;
  std::string host = "127.0.0.1";  // the rendezvous (rank 0's)
  int port = 29500;
  absl::Duration timeout = absl::Minutes(5);
  std::string allreduce = "gloo";  // gloo, ring or hierarchical
  std::string wire = "fp32";       // fp32, bf16 or fp16 (ring and hierarchical)
  std::string node;                // this rank's node for the topology; empty: the hostname
};

// The group (null for world 1) and, on rank 0, the rendezvous it was joined through
// (kept while the group lives).
struct DataParallel {
  std::unique_ptr<dist::Rendezvous> rendezvous;
  std::unique_ptr<dist::GradientGroup> group;
};

// INVALID_ARGUMENT naming the flag for an option out of range; the rendezvous' or the
// group's error when a rank cannot join (by its deadline). Progress lines go to `log`.
absl::StatusOr<DataParallel> JoinDataParallel(const DataParallelOptions& options,
                                              const std::function<void(const std::string&)>& log);

}  // namespace rlfleet::trainer

#endif  // RLFLEET_SERVICES_TRAINER_DATA_PARALLEL_H_

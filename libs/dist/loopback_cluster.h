// Ranks of one process wired over loopback transports as if they sat on several nodes:
// ranks on the same node talk over a plain LoopbackTransport, ranks on different nodes
// over a FaultTransport that makes the link slow (latency + bandwidth). For tests and
// bench/hierarchical_allreduce of the collectives in ring_collectives.h.
#ifndef RLFLEET_LIBS_DIST_LOOPBACK_CLUSTER_H_
#define RLFLEET_LIBS_DIST_LOOPBACK_CLUSTER_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "libs/dist/ring_collectives.h"
#include "libs/dist/topology.h"
#include "libs/transport/fault/fault_transport.h"

namespace rlfleet::dist {

class LoopbackCluster {
 public:
  // `nodes` x `ranks_per_node` ranks, node-major (ranks 0..r-1 on node 0, ...);
  // `inter_node` is applied to every inter-node transfer.
  LoopbackCluster(int nodes, int ranks_per_node, transport::FaultPlan inter_node = {});
  ~LoopbackCluster();

  int size() const { return static_cast<int>(links_.size()); }
  const Topology& topology() const { return topology_; }
  const Links& links(int rank) const { return links_[rank]; }

  // Runs body(rank) on one thread per rank and returns the first error.
  absl::Status RunOnAll(const std::function<absl::Status(int rank)>& body);

 private:
  std::vector<std::unique_ptr<transport::Transport>> intra_, inter_;
  Topology topology_;
  std::vector<Links> links_;
};

}  // namespace rlfleet::dist

#endif  // RLFLEET_LIBS_DIST_LOOPBACK_CLUSTER_H_

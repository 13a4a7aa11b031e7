// Topology-aware communication groups: from where each rank runs (node, NUMA node,
// switch), the groups a hierarchical collective uses: the ranks of each node (fast
// links: NVLink / PCIe / shared memory), one leader per node, and rail rings (the i-th
// rank of every node, so inter-node traffic spreads over every node's NICs). Nodes are
// ordered by switch so that ring neighbours share a switch where they can. Pure code.
#ifndef RLFLEET_LIBS_DIST_TOPOLOGY_H_
#define RLFLEET_LIBS_DIST_TOPOLOGY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rlfleet::dist {

struct RankPlace {
  int rank = 0;
  std::string node;         // host name
  int numa = 0;             // NUMA node inside the host
  std::string switch_name;  // the top-of-rack / leaf switch the node hangs off ("" = one)
};

struct Topology {
  // Nodes in ring order (by switch, then name); for each, its ranks by (NUMA, rank).
  std::vector<std::string> nodes;
  std::vector<std::vector<int>> node_ranks;
  // The first rank of each node, in node order (a group for per-node work; the
  // hierarchical all-reduce uses the rails across nodes instead).
  std::vector<int> leaders;
  // rails[i]: the i-th rank of every node that has one (nodes may differ in size).
  std::vector<std::vector<int>> rails;
  // For each rank: its node's index in `nodes`.
  std::vector<int> node_of;
};

// INVALID_ARGUMENT for ranks that are not exactly 0..n-1 (missing or repeated) or a
// rank without a node name.
absl::StatusOr<Topology> BuildTopology(const std::vector<RankPlace>& places);

}  // namespace rlfleet::dist

#endif  // RLFLEET_LIBS_DIST_TOPOLOGY_H_

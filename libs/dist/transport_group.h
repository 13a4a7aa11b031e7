// A data-parallel gradient group whose all-reduce runs over libs/transport (UCX here:
// TCP or shared memory) with the topology-aware collectives of ring_collectives.h:
// hierarchical (inside each node, then across nodes over the rails, then inside again)
// when the ranks sit on more than one node with as many ranks each, a flat ring
// otherwise; optionally with a bf16 / fp16 wire (across nodes when hierarchical, on
// every link of a flat ring). After a failed all-reduce the group answers
// FAILED_PRECONDITION (the ranks may disagree on what was exchanged). A GlooGroup bootstraps it
// (the rendezvous exchanges every rank's node and UCX address) and carries Broadcast.
#ifndef RLFLEET_LIBS_DIST_TRANSPORT_GROUP_H_
#define RLFLEET_LIBS_DIST_TRANSPORT_GROUP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libs/dist/gloo_group.h"
#include "libs/dist/gradient_group.h"
#include "libs/dist/ring_collectives.h"
#include "libs/dist/topology.h"
#include "libs/transport/transport.h"

namespace rlfleet::dist {

struct TransportGroupOptions {
  std::string node;          // this rank's node (host) name; ranks with the same name share a node
  bool hierarchical = true;  // hierarchical when the topology allows, else a flat ring
  WirePrecision precision = WirePrecision::kFp32;
  absl::Duration timeout = absl::Seconds(60);  // per transfer
  std::string ucx_tls;                         // UCX_TLS for the data plane; empty: UCX's default
  // UCX on the loopback interface only (every rank on this host); false for ranks on
  // several hosts.
  bool loopback_only = true;
};

class TransportGroup : public dist::GradientGroup {
 public:
  // Every rank calls it with its own joined `bootstrap` (which it keeps; Broadcast goes
  // through it). Blocks until every rank has published its address.
  static absl::StatusOr<std::unique_ptr<TransportGroup>> Create(std::unique_ptr<GlooGroup> bootstrap,
                                                                const TransportGroupOptions& options);
  ~TransportGroup() override;

  int rank() const override { return bootstrap_->rank(); }
  int world_size() const override { return bootstrap_->world_size(); }
  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status Broadcast(std::string* bytes) override { return bootstrap_->Broadcast(bytes); }

  const Topology& topology() const { return topology_; }
  bool hierarchical() const { return hierarchical_; }

 private:
  TransportGroup() = default;

  std::unique_ptr<GlooGroup> bootstrap_;
  std::unique_ptr<transport::Transport> transport_;
  TransportGroupOptions options_;
  Topology topology_;
  Links links_;
  bool hierarchical_ = false;
  uint64_t calls_ = 0;  // each all-reduce gets its own tags
  absl::Status broken_;
};

}  // namespace rlfleet::dist

#endif  // RLFLEET_LIBS_DIST_TRANSPORT_GROUP_H_

#include "libs/dist/transport_group.h"

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/metrics/metrics.h"
#include "libs/transport/ucx/ucx_transport.h"

namespace rlfleet::dist {

absl::StatusOr<std::unique_ptr<TransportGroup>> TransportGroup::Create(std::unique_ptr<GlooGroup> bootstrap,
                                                                       const TransportGroupOptions& options) {
  if (bootstrap == nullptr) return absl::InvalidArgumentError("no bootstrap group");
  if (options.node.empty()) return absl::InvalidArgumentError("this rank's node name is empty");
  std::unique_ptr<TransportGroup> g(new TransportGroup);
  g->options_ = options;
  g->bootstrap_ = std::move(bootstrap);
  transport::UcxOptions ucx;
  ucx.tls = options.ucx_tls;
  ucx.loopback_only = options.loopback_only;
  ASSIGN_OR_RETURN(std::unique_ptr<transport::UcxTransport> t, transport::UcxTransport::Create(ucx));
  g->transport_ = std::move(t);
  const int n = g->world_size(), me = g->rank();
  ASSIGN_OR_RETURN(std::vector<std::string> nodes, g->bootstrap_->AllGather("transport-group/node", options.node));
  ASSIGN_OR_RETURN(std::vector<std::string> addresses,
                   g->bootstrap_->AllGather("transport-group/address", g->transport_->LocalAddress()));
  std::vector<RankPlace> places;
  for (int r = 0; r < n; ++r) places.push_back({r, nodes[r], 0, ""});
  ASSIGN_OR_RETURN(g->topology_, BuildTopology(places));
  bool equal = true;
  for (const auto& ranks : g->topology_.node_ranks) equal &= ranks.size() == g->topology_.node_ranks[0].size();
  g->hierarchical_ = options.hierarchical && g->topology_.nodes.size() > 1 && equal;
  g->links_.rank = me;
  g->links_.transport.assign(n, g->transport_.get());
  g->links_.peer.assign(n, 0);
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    ASSIGN_OR_RETURN(g->links_.peer[r], g->transport_->Connect(addresses[r]));
  }
  return g;
}

TransportGroup::~TransportGroup() = default;

absl::Status TransportGroup::AllReduceSum(float* data, size_t n) {
  const std::string backend = hierarchical_ ? "hierarchical" : "ring";
  static metrics::Histogram* const ring_seconds =
      metrics::Global().AddHistogram("rlfleet_dp_allreduce_seconds",
                                     "Gradient all-reduce time per call (data-parallel ranks).", {{"backend", "ring"}});
  static metrics::Histogram* const hier_seconds = metrics::Global().AddHistogram(
      "rlfleet_dp_allreduce_seconds", "Gradient all-reduce time per call (data-parallel ranks).",
      {{"backend", "hierarchical"}});
  static metrics::Counter* const bytes = metrics::Global().AddCounter(
      "rlfleet_dp_allreduce_bytes_total", "Bytes all-reduced (data-parallel ranks).", {{"backend", "transport"}});
  const absl::Time start = absl::Now();
  if (!broken_.ok()) return broken_;
  CollectiveOptions o;
  o.precision = options_.precision;
  o.timeout = options_.timeout;
  o.tag = ++calls_;
  absl::Status s;
  if (hierarchical_) {
    s = HierarchicalAllReduce(absl::MakeSpan(data, n), topology_, links_, o);
  } else {
    std::vector<int> ring;
    for (int r = 0; r < world_size(); ++r) ring.push_back(r);
    s = RingAllReduce(absl::MakeSpan(data, n), ring, links_, o);
  }
  if (!s.ok()) {
    // Ranks may now disagree on what was exchanged: the group is unusable.
    broken_ = absl::FailedPreconditionError(absl::StrCat("an earlier all-reduce failed: ", s.message()));
  }
  (hierarchical_ ? hier_seconds : ring_seconds)->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  bytes->Add(static_cast<double>(n * sizeof(float)));
  return s;
}

}  // namespace rlfleet::dist

#include "libs/dist/loopback_cluster.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "libs/transport/loopback/loopback_transport.h"

namespace rlfleet::dist {

LoopbackCluster::LoopbackCluster(int nodes, int ranks_per_node, transport::FaultPlan inter_node) {
  const int n = nodes * ranks_per_node;
  std::vector<RankPlace> places;
  for (int r = 0; r < n; ++r) {
    intra_.push_back(transport::LoopbackTransport::Create());
    inter_.push_back(std::make_unique<transport::FaultTransport>(transport::LoopbackTransport::Create(), inter_node));
    places.push_back({r, absl::StrCat("node", r / ranks_per_node), 0, ""});
  }
  topology_ = *BuildTopology(places);
  links_.resize(n);
  for (int r = 0; r < n; ++r) {
    Links& l = links_[r];
    l.rank = r;
    l.transport.assign(n, nullptr);
    l.peer.assign(n, 0);
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      const bool same_node = topology_.node_of[p] == topology_.node_of[r];
      transport::Transport* mine = same_node ? intra_[r].get() : inter_[r].get();
      transport::Transport* theirs = same_node ? intra_[p].get() : inter_[p].get();
      l.transport[p] = mine;
      l.peer[p] = *mine->Connect(theirs->LocalAddress());
    }
  }
}

LoopbackCluster::~LoopbackCluster() = default;

absl::Status LoopbackCluster::RunOnAll(const std::function<absl::Status(int rank)>& body) {
  std::vector<absl::Status> status(size());
  std::vector<std::thread> threads;
  for (int r = 0; r < size(); ++r) threads.emplace_back([&, r] { status[r] = body(r); });
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::dist

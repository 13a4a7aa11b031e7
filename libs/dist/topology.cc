#include "libs/dist/topology.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace rlfleet::dist {

absl::StatusOr<Topology> BuildTopology(const std::vector<RankPlace>& places) {
  if (places.empty()) return absl::InvalidArgumentError("no ranks");
  const int n = static_cast<int>(places.size());
  std::vector<const RankPlace*> by_rank(n, nullptr);
  for (const RankPlace& p : places) {
    if (p.rank < 0 || p.rank >= n) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", p.rank, " is outside 0..", n - 1));
    }
    if (by_rank[p.rank] != nullptr) return absl::InvalidArgumentError(absl::StrCat("rank ", p.rank, " appears twice"));
    if (p.node.empty()) return absl::InvalidArgumentError(absl::StrCat("rank ", p.rank, " has no node"));
    by_rank[p.rank] = &p;
  }
  // Nodes by (switch, name); a node's switch is the one its lowest rank names.
  std::map<std::string, std::string> switch_of;
  for (const RankPlace* p : by_rank) switch_of.emplace(p->node, p->switch_name);
  std::vector<std::pair<std::string, std::string>> order;  // (switch, node)
  for (const auto& [node, sw] : switch_of) order.emplace_back(sw, node);
  std::sort(order.begin(), order.end());
  Topology t;
  std::map<std::string, int> index;
  for (const auto& [sw, node] : order) {
    index[node] = static_cast<int>(t.nodes.size());
    t.nodes.push_back(node);
  }
  t.node_ranks.resize(t.nodes.size());
  t.node_of.resize(n);
  for (const RankPlace* p : by_rank) {
    t.node_of[p->rank] = index[p->node];
    t.node_ranks[index[p->node]].push_back(p->rank);
  }
  for (std::vector<int>& ranks : t.node_ranks) {
    std::sort(ranks.begin(), ranks.end(),
              [&](int a, int b) { return std::tie(by_rank[a]->numa, a) < std::tie(by_rank[b]->numa, b); });
    t.leaders.push_back(ranks.front());
  }
  size_t widest = 0;
  for (const auto& ranks : t.node_ranks) widest = std::max(widest, ranks.size());
  t.rails.resize(widest);
  for (size_t i = 0; i < widest; ++i) {
    for (const auto& ranks : t.node_ranks) {
      if (i < ranks.size()) t.rails[i].push_back(ranks[i]);
    }
  }
  return t;
}

}  // namespace rlfleet::dist

#include "services/controller/reward_routes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace rlfleet::controller {

bool ServesNamedTasksOnly(const v1::ReplicaInfo& replica) {
  return replica.role() == v1::REPLICA_ROLE_REWARD && replica.labels().contains(kRewardTasksLabel);
}

std::map<std::string, std::string> RewardTaskRoutes(const std::vector<v1::ReplicaInfo>& replicas) {
  std::map<std::string, std::string> routes;
  for (const v1::ReplicaInfo& r : replicas) {
    if (!ServesNamedTasksOnly(r)) continue;
    for (absl::string_view task : absl::StrSplit(r.labels().at(kRewardTasksLabel), ',', absl::SkipWhitespace())) {
      routes.emplace(std::string(absl::StripAsciiWhitespace(task)), r.grpc_address());
    }
  }
  return routes;
}

TaskRoutedReward::TaskRoutedReward(std::unique_ptr<RewardPeer> fallback,
                                   std::map<std::string, std::shared_ptr<RewardPeer>> by_task)
    : fallback_(std::move(fallback)), by_task_(std::move(by_task)) {}

absl::Status TaskRoutedReward::Score(const v1::ScoreRequest& request, v1::ScoreResponse* response) {
  // Each peer's items (their indices in the request), in request order.
  std::map<RewardPeer*, std::vector<int>> shares;
  std::map<RewardPeer*, std::string> names;
  for (int i = 0; i < request.items_size(); ++i) {
    auto routed = by_task_.find(request.items(i).task());
    RewardPeer* peer = routed != by_task_.end() ? routed->second.get() : fallback_.get();
    shares[peer].push_back(i);
    names.emplace(peer, routed != by_task_.end() ? absl::StrCat("the reward worker of task ", routed->first)
                                                 : std::string("the reward service"));
  }
  std::vector<v1::ScoreResult> results(request.items_size());
  double elapsed_ms = 0;
  for (const auto& [peer, indices] : shares) {
    v1::ScoreRequest part;
    for (int i : indices) *part.add_items() = request.items(i);
    v1::ScoreResponse scored;
    if (absl::Status s = peer->Score(part, &scored); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(names[peer], ": ", s.message()));
    }
    if (scored.results_size() != part.items_size()) {
      return absl::InternalError(
          absl::StrCat(names[peer], " returned ", scored.results_size(), " results for ", part.items_size(), " items"));
    }
    for (size_t k = 0; k < indices.size(); ++k) results[indices[k]] = std::move(*scored.mutable_results(k));
    elapsed_ms = std::max(elapsed_ms, scored.elapsed_ms());
  }
  response->Clear();
  for (v1::ScoreResult& r : results) *response->add_results() = std::move(r);
  response->set_elapsed_ms(elapsed_ms);
  return absl::OkStatus();
}

}  // namespace rlfleet::controller

#include "services/controller/reward_routes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/io/coded_stream.h"

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

SplitReward::SplitReward(std::unique_ptr<RewardPeer> inner, int max_items, size_t max_bytes)
    : inner_(std::move(inner)), max_items_(std::max(1, max_items)), max_bytes_(max_bytes) {}

absl::Status SplitReward::Score(const v1::ScoreRequest& request, v1::ScoreResponse* response) {
  // The parts: [begin, end) ranges of items, each within both bounds. An item costs its
  // encoded size plus its field tag and length prefix in the request.
  v1::ScoreRequest header = request;
  header.clear_items();
  const size_t fixed = header.ByteSizeLong();
  std::vector<std::pair<int, int>> parts;
  size_t bytes = fixed;
  for (int i = 0; i < request.items_size(); ++i) {
    const size_t size = request.items(i).ByteSizeLong();
    const size_t cost = 1 + google::protobuf::io::CodedOutputStream::VarintSize64(size) + size;
    if (fixed + cost > max_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat("items[", i, "] (", request.items(i).item_id(), ") is ", cost,
                                                     " bytes: over the ", max_bytes_,
                                                     " bytes one Score call carries (--max_message_bytes)"));
    }
    if (parts.empty() || parts.back().second - parts.back().first >= max_items_ || bytes + cost > max_bytes_) {
      parts.emplace_back(i, i);
      bytes = fixed;
    }
    ++parts.back().second;
    bytes += cost;
  }
  if (parts.size() <= 1) return inner_->Score(request, response);
  response->Clear();
  double elapsed_ms = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const auto [begin, end] = parts[p];
    v1::ScoreRequest part = header;
    part.mutable_items()->Reserve(end - begin);
    for (int i = begin; i < end; ++i) *part.add_items() = request.items(i);
    v1::ScoreResponse scored;
    if (absl::Status s = inner_->Score(part, &scored); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("part ", p + 1, " of ", parts.size(), " (items ", begin, "..", end - 1,
                                                 "): ", s.message()));
    }
    if (scored.results_size() != end - begin) {
      return absl::InternalError(absl::StrCat("part ", p + 1, " of ", parts.size(), ": ", scored.results_size(),
                                              " results for ", end - begin, " items"));
    }
    for (v1::ScoreResult& r : *scored.mutable_results()) *response->add_results() = std::move(r);
    elapsed_ms += scored.elapsed_ms();
  }
  response->set_elapsed_ms(elapsed_ms);
  return absl::OkStatus();
}

}  // namespace rlfleet::controller

#include "services/controller/run_peers_factory.h"

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "libs/common/status_macros.h"
#include "services/controller/discovery.h"
#include "services/controller/reward_routes.h"

namespace rlfleet::controller {

absl::StatusOr<RunPeers> RunPeersFactory::Make() {
  const absl::Duration timeout = addresses_.timeout;
  RunPeers peers;
  for (const std::string& a : RolloutAddressesForRun(*core_, addresses_.rollout)) {
    ASSIGN_OR_RETURN(std::unique_ptr<RolloutReplica> r, NewGrpcRolloutReplica(client_, a, timeout));
    peers.rollouts.push_back(std::move(r));
  }
  if (peers.rollouts.empty()) {
    return absl::FailedPreconditionError(
        "the controller knows no rollout replica: none registered (--registry_address) and no --rollout");
  }
  ASSIGN_OR_RETURN(std::string reward,
                   ResolvePeerAddress(*core_, v1::REPLICA_ROLE_REWARD, addresses_.reward, "reward"));
  ASSIGN_OR_RETURN(std::string buffer,
                   ResolvePeerAddress(*core_, v1::REPLICA_ROLE_BUFFER, addresses_.buffer, "buffer"));
  ASSIGN_OR_RETURN(std::string trainer,
                   ResolvePeerAddress(*core_, v1::REPLICA_ROLE_TRAINER, addresses_.trainer, "trainer"));
  ASSIGN_OR_RETURN(peers.reward, NewGrpcRewardPeer(client_, reward, timeout));
  // Tasks a reward worker serves alone go to it (reward_routes.h).
  std::map<std::string, std::shared_ptr<RewardPeer>> routed, by_address;
  for (const auto& [task, address] : RewardRoutes(*core_)) {
    std::shared_ptr<RewardPeer>& peer = by_address[address];
    if (peer == nullptr) {
      ASSIGN_OR_RETURN(std::unique_ptr<RewardPeer> made, NewGrpcRewardPeer(client_, address, timeout));
      peer = std::move(made);
    }
    routed[task] = peer;
  }
  if (!routed.empty()) peers.reward = std::make_unique<TaskRoutedReward>(std::move(peers.reward), std::move(routed));
  ASSIGN_OR_RETURN(peers.buffer, NewGrpcBufferPeer(client_, buffer, timeout));
  ASSIGN_OR_RETURN(peers.trainer, NewGrpcTrainerPeer(client_, trainer, timeout));
  // Versions go through the weights service when there is one.
  absl::StatusOr<std::string> weights =
      ResolvePeerAddress(*core_, v1::REPLICA_ROLE_WEIGHTS, addresses_.weights, "weights");
  std::shared_ptr<WeightsRoute> route;
  if (weights.ok()) {
    ASSIGN_OR_RETURN(route, WeightsRoute::Connect(client_, *weights, timeout));
    peers.trainer = PublishThrough(std::move(peers.trainer), route);
    for (auto& r : peers.rollouts) r = InstallThrough(std::move(r), route);
  }
  absl::MutexLock lock(&mu_);
  route_ = std::move(route);
  return peers;
}

absl::StatusOr<std::unique_ptr<RolloutReplica>> RunPeersFactory::Replica(const std::string& address) {
  absl::StatusOr<std::unique_ptr<RolloutReplica>> replica = NewGrpcRolloutReplica(client_, address, addresses_.timeout);
  std::shared_ptr<WeightsRoute> route;
  {
    absl::MutexLock lock(&mu_);
    route = route_;
  }
  if (!replica.ok() || route == nullptr) return replica;
  return InstallThrough(std::move(*replica), route);
}

}  // namespace rlfleet::controller

// Reward scoring routed by task (free of gRPC). A reward replica may serve some tasks
// alone: it registers with the label `reward.tasks` ("t1,t2"), as the Python reward
// worker does (python/rlfleet/reward_worker.py). A run's items of such a task go to that
// replica, every other item to the fleet's reward service; the replies come back as one,
// in request order. Such a replica is never a run's default reward service.
#ifndef RLFLEET_SERVICES_CONTROLLER_REWARD_ROUTES_H_
#define RLFLEET_SERVICES_CONTROLLER_REWARD_ROUTES_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "rlfleet/v1/controller.pb.h"
#include "rlfleet/v1/reward.pb.h"
#include "services/controller/run_loop.h"

namespace rlfleet::controller {

inline constexpr char kRewardTasksLabel[] = "reward.tasks";

// Task -> the address of the registered reward replica that serves it alone (the
// label's tasks; for a task two replicas name, the first in `replicas`' order).
std::map<std::string, std::string> RewardTaskRoutes(const std::vector<v1::ReplicaInfo>& replicas);

// Whether `replica` serves only the tasks its label names (so it is no default).
bool ServesNamedTasksOnly(const v1::ReplicaInfo& replica);

class TaskRoutedReward : public RewardPeer {
 public:
  // `fallback` scores every task `by_task` does not name. Peers may appear under
  // several tasks.
  TaskRoutedReward(std::unique_ptr<RewardPeer> fallback, std::map<std::string, std::shared_ptr<RewardPeer>> by_task);

  // All or nothing, as one Score call: each peer's share in one call (in request order
  // within it); an error names the task and stops the batch. INTERNAL when a peer
  // answers with another number of results than it was given items.
  absl::Status Score(const v1::ScoreRequest& request, v1::ScoreResponse* response) override;

 private:
  const std::unique_ptr<RewardPeer> fallback_;
  const std::map<std::string, std::shared_ptr<RewardPeer>> by_task_;
};

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_REWARD_ROUTES_H_

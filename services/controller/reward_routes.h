// Reward scoring routed by task (free of gRPC). A reward replica may serve some tasks
// alone: it registers with the label `reward.tasks` ("t1,t2"), as the Python reward
// worker does (python/rlfleet/reward_worker.py). A run's items of such a task go to that
// replica, every other item to the fleet's reward service; the replies come back as one,
// in request order. Such a replica is never a run's default reward service.
// Every call to a reward replica is split to what one call may carry (SplitReward).
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
// Items a reward replica scores in one call: the fleet's reward service
// (services/reward kMaxItemsPerRequest) and the Python worker (MAX_ITEMS) take 1024.
inline constexpr int kMaxScoreItems = 1024;
// Of a call's --max_message_bytes, what SplitReward leaves for the request's other
// fields and gRPC's framing.
inline constexpr size_t kScoreMessageMargin = 4096;

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

// Scores a batch of any size through `inner` in calls of at most `max_items` items and
// `max_bytes` encoded bytes each (a step of 1024 long responses is more than one gRPC
// message carries), one call after another in request order; the replies come back as
// one, as if scored in one call. INVALID_ARGUMENT naming the item when one alone is over
// `max_bytes`; an inner error stops the batch (annotated with the part when there are
// several); INTERNAL when a part comes back with another number of results.
// Thread-safe if `inner` is.
class SplitReward : public RewardPeer {
 public:
  SplitReward(std::unique_ptr<RewardPeer> inner, int max_items, size_t max_bytes);
  absl::Status Score(const v1::ScoreRequest& request, v1::ScoreResponse* response) override;

 private:
  const std::unique_ptr<RewardPeer> inner_;
  const int max_items_;
  const size_t max_bytes_;
};

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_REWARD_ROUTES_H_

// Registry discovery for runs (free of gRPC): where a run's reward, buffer and trainer
// are (a flag, else the registry), which rollout replicas a new run starts with, and
// RolloutDiscovery, which admits rollout replicas that register into the active run
// and drains those that deregister or expire.
#ifndef RLFLEET_SERVICES_CONTROLLER_DISCOVERY_H_
#define RLFLEET_SERVICES_CONTROLLER_DISCOVERY_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "libs/registry/watch.h"
#include "services/controller/controller_core.h"
#include "services/controller/run_manager.h"

namespace rlfleet::controller {

// The address of the `role` service a run uses: `flag_value` when set, else the
// registered replica of that role with the fewest in-flight + queued requests (ties,
// and replicas that report no load: the first listed). FAILED_PRECONDITION naming the
// role and `flag_name` when neither.
absl::StatusOr<std::string> ResolvePeerAddress(ControllerCore& core, v1::ReplicaRole role,
                                               const std::string& flag_value, absl::string_view flag_name);

// Task -> address of the registered reward replicas that serve tasks alone
// (reward_routes.h); ResolvePeerAddress never picks those as the reward service.
std::map<std::string, std::string> RewardRoutes(ControllerCore& core);

// A new run's rollout replicas: `flag_addresses` (comma-separated) and every registered
// rollout replica, each once, sorted.
std::vector<std::string> RolloutAddressesForRun(ControllerCore& core, const std::string& flag_addresses);

class RolloutDiscovery {
 public:
  using MakeReplica = std::function<absl::StatusOr<std::unique_ptr<RolloutReplica>>(const std::string& address)>;
  using Log = std::function<void(const std::string&)>;

  // Watches `core` for rollout replicas on a thread of its own: ADDED -> the active
  // run admits the replica (with its current weights), REMOVED / EXPIRED -> it leaves
  // drained. Without an active run nothing happens (a run lists the registry when it
  // starts). Every `reconcile_every` it also offers the active run each registered
  // replica that is not live in it (one the run dropped when it hung or failed, and
  // that came back without registering again), at most once per `retry_after` each.
  // Other failures go to `log`. `core` and `runs` must outlive it.
  static absl::StatusOr<std::unique_ptr<RolloutDiscovery>> Start(ControllerCore* core, RunManager* runs,
                                                                 MakeReplica make, Log log,
                                                                 absl::Duration reconcile_every = absl::Seconds(5),
                                                                 absl::Duration retry_after = absl::Seconds(30));
  ~RolloutDiscovery();  // stops watching and joins

 private:
  RolloutDiscovery(ControllerCore* core, std::shared_ptr<registry::Subscription> sub, RunManager* runs,
                   MakeReplica make, Log log, absl::Duration reconcile_every, absl::Duration retry_after);
  void Loop();
  void Reconcile();  // (on the loop's thread)
  // Makes a replica for `address` and asks the active run to admit it: AdmitRollout's
  // answer (ALREADY_EXISTS when it is in the run), or why it could not be made.
  absl::Status Offer(const std::string& address);

  ControllerCore* const core_;
  absl::Mutex mu_;
  std::shared_ptr<registry::Subscription> sub_ ABSL_GUARDED_BY(mu_);
  RunManager* const runs_;
  const MakeReplica make_;
  const Log log_;
  const absl::Duration reconcile_every_, retry_after_;
  absl::flat_hash_map<std::string, absl::Time> offered_;  // (the loop's thread only) address -> last offer
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_DISCOVERY_H_

// The peers a run is wired to: the rollout replicas given by flag and every registered
// one; the reward, buffer and trainer given by flag, else the registered one; versions
// published and installed through the weights service when there is one (the route is
// kept, so that a replica discovered mid-run installs through it too).
#ifndef RLFLEET_SERVICES_CONTROLLER_RUN_PEERS_FACTORY_H_
#define RLFLEET_SERVICES_CONTROLLER_RUN_PEERS_FACTORY_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/rpc/client.h"
#include "services/controller/controller_core.h"
#include "services/controller/run_manager.h"
#include "services/controller/run_peers_grpc.h"

namespace rlfleet::controller {

// The controller's --rollout, --reward, --buffer, --trainer and --weights (empty: the
// registered one) and --peer_timeout.
struct PeerAddresses {
  std::string rollout;  // comma-separated, besides the registered ones
  std::string reward, buffer, trainer, weights;
  absl::Duration timeout = absl::Seconds(120);
};

class RunPeersFactory {
 public:
  // `core` (not owned) is the registry peers are looked up in; `client` the options of
  // every call to them (the controller's role when it holds the admin token).
  RunPeersFactory(ControllerCore* core, rpc::ClientOptions client, PeerAddresses addresses)
      : core_(core), client_(std::move(client)), addresses_(std::move(addresses)) {}

  // A new run's peers. FAILED_PRECONDITION when no rollout replica is known, the
  // resolver's error naming the flag for a reward, buffer or trainer there is none of.
  absl::StatusOr<RunPeers> Make();
  // A rollout replica discovered mid-run, installing through the current run's route.
  absl::StatusOr<std::unique_ptr<RolloutReplica>> Replica(const std::string& address);

 private:
  ControllerCore* const core_;
  const rpc::ClientOptions client_;
  const PeerAddresses addresses_;
  absl::Mutex mu_;
  // The active run's route through the weights service; null without one.
  std::shared_ptr<WeightsRoute> route_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_RUN_PEERS_FACTORY_H_

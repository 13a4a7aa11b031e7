// gRPC adapters of the run loop's peers (run_loop.h): each call gets a deadline and the
// bearer token of the client options; gRPC status becomes absl::Status.
#ifndef RLFLEET_SERVICES_CONTROLLER_RUN_PEERS_GRPC_H_
#define RLFLEET_SERVICES_CONTROLLER_RUN_PEERS_GRPC_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/rpc/client.h"
#include "services/controller/run_loop.h"

namespace rlfleet::controller {

// `options.target` is ignored; `address` is the peer's host:port.
absl::StatusOr<std::unique_ptr<RolloutReplica>> NewGrpcRolloutReplica(const rpc::ClientOptions& options,
                                                                      const std::string& address,
                                                                      absl::Duration timeout);
// A reward peer's calls are split to fit `options.max_message_bytes` and
// kMaxScoreItems (reward_routes.h SplitReward).
absl::StatusOr<std::unique_ptr<RewardPeer>> NewGrpcRewardPeer(const rpc::ClientOptions& options,
                                                              const std::string& address, absl::Duration timeout);
absl::StatusOr<std::unique_ptr<BufferPeer>> NewGrpcBufferPeer(const rpc::ClientOptions& options,
                                                              const std::string& address, absl::Duration timeout);
absl::StatusOr<std::unique_ptr<TrainerPeer>> NewGrpcTrainerPeer(const rpc::ClientOptions& options,
                                                                const std::string& address, absl::Duration timeout);

// Weight publishing through the weights service (rlfleet-weights): the trainer's
// versions are published there (it checks the digest before any replica sees them) and
// replicas install them through it (SyncVersion, each under the call deadline).
class WeightsRoute {
 public:
  static absl::StatusOr<std::shared_ptr<WeightsRoute>> Connect(const rpc::ClientOptions& options,
                                                               const std::string& address, absl::Duration timeout);
  virtual ~WeightsRoute() = default;
  virtual absl::Status Publish(const v1::PublishWeightsResponse& published) = 0;
  // Registers the replica as a destination (idempotent) and has it install the version.
  virtual absl::Status Install(const std::string& replica_address, const v1::PrepareWeightsRequest& request) = 0;
  // The same for several replicas in one round (the weights service chains them, so its
  // link carries each byte once per chain); a status per address, in their order.
  virtual std::vector<absl::Status> InstallAll(const std::vector<std::string>& replica_addresses,
                                               const v1::PrepareWeightsRequest& request) = 0;
};

// The trainer, publishing each version to `route` too.
std::unique_ptr<TrainerPeer> PublishThrough(std::unique_ptr<TrainerPeer> trainer, std::shared_ptr<WeightsRoute> route);
// The replica, installing versions through `route`.
std::unique_ptr<RolloutReplica> InstallThrough(std::unique_ptr<RolloutReplica> replica,
                                               std::shared_ptr<WeightsRoute> route);

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_RUN_PEERS_GRPC_H_

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
absl::StatusOr<std::unique_ptr<RolloutReplica>> NewGrpcRolloutReplica(
    const rpc::ClientOptions& options, const std::string& address, absl::Duration timeout);
absl::StatusOr<std::unique_ptr<RewardPeer>> NewGrpcRewardPeer(const rpc::ClientOptions& options,
                                                              const std::string& address,
                                                              absl::Duration timeout);
absl::StatusOr<std::unique_ptr<BufferPeer>> NewGrpcBufferPeer(const rpc::ClientOptions& options,
                                                              const std::string& address,
                                                              absl::Duration timeout);
absl::StatusOr<std::unique_ptr<TrainerPeer>> NewGrpcTrainerPeer(const rpc::ClientOptions& options,
                                                                const std::string& address,
                                                                absl::Duration timeout);

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_RUN_PEERS_GRPC_H_

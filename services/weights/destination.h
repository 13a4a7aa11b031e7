// Destination: how the weights service reaches one rollout replica (gRPC in the
// service, fakes in tests).
#ifndef RLFLEET_SERVICES_WEIGHTS_DESTINATION_H_
#define RLFLEET_SERVICES_WEIGHTS_DESTINATION_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rlfleet/v1/rollout.pb.h"

namespace rlfleet::weights {

class Destination {
 public:
  virtual ~Destination() = default;
  // Stages and installs the version (RolloutService.UpdateWeights); gives up at
  // `deadline` (DEADLINE_EXCEEDED).
  virtual absl::StatusOr<v1::CommitWeightsResponse> Install(const v1::PrepareWeightsRequest& request,
                                                            absl::Time deadline) = 0;
  // The replica's state and data-plane endpoint (RolloutService.GetInfo).
  virtual absl::StatusOr<v1::GetInfoResponse> Info(absl::Time deadline) {
    return absl::UnimplementedError("this destination reports no info");
  }
};
using DestinationFactory = std::function<std::unique_ptr<Destination>(const std::string& grpc_address)>;

}  // namespace rlfleet::weights

#endif  // RLFLEET_SERVICES_WEIGHTS_DESTINATION_H_

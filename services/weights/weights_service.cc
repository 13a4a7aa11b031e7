#include "services/weights/weights_service.h"

#include <grpcpp/client_context.h>

#include "libs/common/status_macros.h"
#include "libs/rpc/client.h"
#include "rlfleet/v1/rollout.grpc.pb.h"

namespace rlfleet::weights {
namespace {

class GrpcDestination : public Destination {
 public:
  GrpcDestination(const rpc::ClientOptions& options, const std::string& address) {
    rpc::ClientOptions o = options;
    o.target = address;
    auto client = rpc::ServiceClient<v1::RolloutService>::Connect(o);
    if (client.ok()) {
      client_ = *std::move(client);
    } else {
      error_ = client.status();
    }
  }
  // Once: the weights core decides what a failed install means for the replica.
  absl::StatusOr<v1::CommitWeightsResponse> Install(const v1::PrepareWeightsRequest& request,
                                                    absl::Time deadline) override {
    v1::CommitWeightsResponse response;
    RETURN_IF_ERROR(Call("UpdateWeights", &Stub::UpdateWeights, request, &response, rpc::Retry::kOnce, deadline));
    return response;
  }
  absl::StatusOr<v1::GetInfoResponse> Info(absl::Time deadline) override {
    v1::GetInfoResponse response;
    RETURN_IF_ERROR(
        Call("GetInfo", &Stub::GetInfo, v1::GetInfoRequest(), &response, rpc::Retry::kIdempotent, deadline));
    return response;
  }

 private:
  using Stub = v1::RolloutService::Stub;
  // One call to the replica, given up at `deadline` (a passed one fails at once rather
  // than meaning "the default"); errors name the method and the replica.
  template <typename Request, typename Response>
  absl::Status Call(absl::string_view method,
                    grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Response*), const Request& request,
                    Response* response, rpc::Retry retry, absl::Time deadline) {
    if (client_ == nullptr) return error_;
    return client_->Unary(method, rpc, request, response, retry,
                          std::max(deadline - absl::Now(), absl::Milliseconds(1)));
  }

  std::unique_ptr<rpc::ServiceClient<v1::RolloutService>> client_;
  absl::Status error_;
};

}  // namespace

std::unique_ptr<Destination> NewGrpcDestination(const rpc::ClientOptions& options, const std::string& address) {
  return std::make_unique<GrpcDestination>(options, address);
}

}  // namespace rlfleet::weights

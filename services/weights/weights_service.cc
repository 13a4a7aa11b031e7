#include "services/weights/weights_service.h"

#include <grpcpp/client_context.h>

#include "libs/common/status_macros.h"
#include "libs/rpc/status_conversion.h"
#include "rlfleet/v1/rollout.grpc.pb.h"

namespace rlfleet::weights {
namespace {

class GrpcDestination : public Destination {
 public:
  GrpcDestination(const rpc::ClientOptions& options, const std::string& address)
      : options_(options), address_(address) {
    rpc::ClientOptions o = options;
    o.target = address;
    auto channel = rpc::MakeChannel(o);
    if (channel.ok()) {
      stub_ = v1::RolloutService::NewStub(*channel);
    } else {
      error_ = channel.status();
    }
  }
  absl::StatusOr<v1::CommitWeightsResponse> Install(const v1::PrepareWeightsRequest& request,
                                                    absl::Time deadline) override {
    v1::CommitWeightsResponse response;
    RETURN_IF_ERROR(Call(&v1::RolloutService::Stub::UpdateWeights, request, &response, deadline));
    return response;
  }
  absl::StatusOr<v1::GetInfoResponse> Info(absl::Time deadline) override {
    v1::GetInfoResponse response;
    RETURN_IF_ERROR(Call(&v1::RolloutService::Stub::GetInfo, v1::GetInfoRequest(), &response, deadline));
    return response;
  }

 private:
  // One unary call to the replica, given up at `deadline` (a passed one fails at once
  // rather than meaning "the default"); errors name the replica.
  template <typename Request, typename Response>
  absl::Status Call(grpc::Status (v1::RolloutService::Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response, absl::Time deadline) {
    if (stub_ == nullptr) return error_;
    std::unique_ptr<grpc::ClientContext> context =
        rpc::NewCallContext(options_, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    absl::Status s = rpc::ToAbslStatus((stub_.get()->*rpc)(context.get(), request, response));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("replica ", address_, ": ", s.message()));
    return absl::OkStatus();
  }

  const rpc::ClientOptions options_;
  const std::string address_;
  std::unique_ptr<v1::RolloutService::Stub> stub_;
  absl::Status error_;
};

}  // namespace

std::unique_ptr<Destination> NewGrpcDestination(const rpc::ClientOptions& options, const std::string& address) {
  return std::make_unique<GrpcDestination>(options, address);
}

}  // namespace rlfleet::weights

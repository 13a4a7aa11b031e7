#include "services/weights/weights_service.h"

#include <grpcpp/client_context.h>

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
    if (stub_ == nullptr) return error_;
    std::unique_ptr<grpc::ClientContext> context =
        rpc::NewCallContext(options_, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    v1::CommitWeightsResponse response;
    absl::Status s = rpc::ToAbslStatus(stub_->UpdateWeights(context.get(), request, &response));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("replica ", address_, ": ", s.message()));
    return response;
  }
  absl::StatusOr<v1::GetInfoResponse> Info(absl::Time deadline) override {
    if (stub_ == nullptr) return error_;
    std::unique_ptr<grpc::ClientContext> context =
        rpc::NewCallContext(options_, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    v1::GetInfoResponse response;
    absl::Status s = rpc::ToAbslStatus(stub_->GetInfo(context.get(), {}, &response));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("replica ", address_, ": ", s.message()));
    return response;
  }

 private:
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

// gRPC adapter for WeightsCore (WeightsService), and the Destination that reaches a
// rollout replica over gRPC (RolloutService.UpdateWeights). WatchVersions answers
// UNIMPLEMENTED in this slice. Thread-safe.
#ifndef RLFLEET_SERVICES_WEIGHTS_WEIGHTS_SERVICE_H_
#define RLFLEET_SERVICES_WEIGHTS_WEIGHTS_SERVICE_H_

#include <memory>
#include <string>

#include "libs/rpc/client.h"
#include "libs/rpc/server_call.h"
#include "rlfleet/v1/weights.grpc.pb.h"
#include "services/weights/weights_core.h"

namespace rlfleet::weights {

// A rollout replica at `address`, reached with `options`' credentials.
std::unique_ptr<Destination> NewGrpcDestination(const rpc::ClientOptions& options, const std::string& address);

class WeightsServiceImpl final : public v1::WeightsService::CallbackService {
 public:
  WeightsServiceImpl(WeightsCore* core, rpc::CallAuth auth) : core_(core), auth_(std::move(auth)) {}

  grpc::ServerUnaryReactor* PublishVersion(grpc::CallbackServerContext* c, const v1::PublishVersionRequest* req,
                                           v1::PublishVersionResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->PublishVersion(*req, resp); });
  }
  grpc::ServerUnaryReactor* RegisterDestination(grpc::CallbackServerContext* c,
                                                const v1::RegisterDestinationRequest* req,
                                                v1::RegisterDestinationResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->RegisterDestination(*req, resp); });
  }
  grpc::ServerUnaryReactor* UnregisterDestination(grpc::CallbackServerContext* c,
                                                  const v1::UnregisterDestinationRequest* req,
                                                  v1::UnregisterDestinationResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->UnregisterDestination(*req, resp); });
  }
  grpc::ServerUnaryReactor* SyncVersion(grpc::CallbackServerContext* c, const v1::SyncVersionRequest* req,
                                        v1::SyncVersionResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->SyncVersion(*req, resp); });
  }
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* c, const v1::GetPlanRequest* req,
                                    v1::GetPlanResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->GetPlan(*req, resp); });
  }
  grpc::ServerUnaryReactor* GetSyncStatus(grpc::CallbackServerContext* c, const v1::GetSyncStatusRequest* req,
                                          v1::GetSyncStatusResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->GetSyncStatus(*req, resp); });
  }

  // Not offered yet: refused with a message (gRPC's default UNIMPLEMENTED has none).
  grpc::ServerWriteReactor<v1::VersionEvent>* WatchVersions(grpc::CallbackServerContext* c,
                                                            const v1::WatchVersionsRequest*) override {
    absl::Status s = rpc::Authorize(*c, auth_, rpc::Role::kFleet, "WatchVersions");
    if (s.ok()) s = absl::UnimplementedError("WatchVersions: not offered yet; poll GetSyncStatus");
    return new rpc::FinishedStream<grpc::ServerWriteReactor<v1::VersionEvent>>(rpc::ToGrpcStatus(s));
  }

 private:
  WeightsCore* const core_;
  const rpc::CallAuth auth_;
};

}  // namespace rlfleet::weights

#endif  // RLFLEET_SERVICES_WEIGHTS_WEIGHTS_SERVICE_H_

// gRPC adapter for RolloutCore: GenerateBatch, GetInfo, Drain, Resume. The streaming
// Generate and the weight path's PrepareWeights / CommitWeights / UpdateWeights answer
// UNIMPLEMENTED until they land. Thread-safe.
#ifndef RLFLEET_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_
#define RLFLEET_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_

#include <functional>

#include "absl/time/clock.h"

#include "libs/rpc/server_call.h"
#include "rlfleet/v1/rollout.grpc.pb.h"
#include "services/rollout/rollout_core.h"

namespace rlfleet::rollout {

class RolloutServiceImpl final : public v1::RolloutService::CallbackService {
 public:
  // `on_state_change` is told whether the replica serves (the health status follows it).
  RolloutServiceImpl(RolloutCore* core, rpc::CallAuth auth, std::function<void(bool)> on_state_change = {})
      : core_(core), auth_(std::move(auth)), on_state_change_(std::move(on_state_change)) {}

  grpc::ServerUnaryReactor* GenerateBatch(grpc::CallbackServerContext* c, const v1::GenerateBatchRequest* req,
                                          v1::GenerateBatchResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->GenerateBatch(*req, resp); });
  }
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* c, const v1::GetInfoRequest*,
                                    v1::GetInfoResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->GetInfo(resp); });
  }
  // Until the weights service lands, only a FILE-backend hand-off is accepted: one
  // chunk whose source segment names a safetensors file (the trainer's PublishWeights).
  grpc::ServerUnaryReactor* UpdateWeights(grpc::CallbackServerContext* c, const v1::PrepareWeightsRequest* req,
                                          v1::CommitWeightsResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&]() -> absl::Status {
      if (req->chunks_size() != 1 || req->chunks(0).source().segment().backend() != v1::TRANSFER_BACKEND_FILE) {
        return absl::UnimplementedError(
            "UpdateWeights takes one chunk from a FILE source until the weights service lands");
      }
      const absl::Time start = absl::Now();
      const uint64_t version = req->manifest().version().version();
      absl::Status s = core_->InstallFromFile(req->chunks(0).source().segment().worker_address(), version);
      if (!s.ok()) return s;
      resp->mutable_installed_version()->set_version(version);
      resp->set_install_us(absl::ToInt64Microseconds(absl::Now() - start));
      if (on_state_change_) on_state_change_(core_->serving());
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* c, const v1::DrainRequest* req,
                                  v1::DrainResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] {
      absl::Status s = core_->Drain(*req, resp);
      if (s.ok() && on_state_change_) on_state_change_(core_->serving());
      return s;
    });
  }
  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* c, const v1::ResumeRequest*,
                                   v1::ResumeResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] {
      absl::Status s = core_->Resume(resp);
      if (s.ok() && on_state_change_) on_state_change_(core_->serving());
      return s;
    });
  }

 private:
  RolloutCore* const core_;
  const rpc::CallAuth auth_;
  std::function<void(bool)> on_state_change_;
};

}  // namespace rlfleet::rollout

#endif  // RLFLEET_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_

// gRPC adapter for TrainerCore. PublishWeights publishes to the publish target (a
// directory, or the trainer's data plane) and, with a weights sink, hands the version
// to the weights service before it answers. Thread-safe.
#ifndef RLFLEET_SERVICES_TRAINER_TRAINER_SERVICE_H_
#define RLFLEET_SERVICES_TRAINER_TRAINER_SERVICE_H_

#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/server_call.h"
#include "rlfleet/v1/trainer.grpc.pb.h"
#include "services/trainer/trainer_core.h"
#include "services/trainer/weights_client.h"

namespace rlfleet::trainer {

class TrainerServiceImpl final : public v1::TrainerService::CallbackService {
 public:
  // PublishWeights' hand-off deadline when timeout_ms is 0 (the weights service pulls
  // and checks the whole version before it answers).
  static constexpr absl::Duration kDefaultHandOffTimeout = absl::Minutes(5);

  // `weights` (not owned; may be null: the caller hands versions on itself).
  TrainerServiceImpl(TrainerCore* core, rpc::CallAuth auth, TrainerCore::PublishTarget publish = {},
                     WeightsSink* weights = nullptr)
      : core_(core), auth_(std::move(auth)), publish_(std::move(publish)), weights_(weights) {}

  grpc::ServerUnaryReactor* TrainStep(grpc::CallbackServerContext* c, const v1::TrainStepRequest* req,
                                      v1::TrainStepResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->TrainStep(*req, resp); });
  }
  grpc::ServerUnaryReactor* GetState(grpc::CallbackServerContext* c, const v1::GetStateRequest*,
                                     v1::GetStateResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->GetState(resp); });
  }
  grpc::ServerUnaryReactor* SaveCheckpoint(grpc::CallbackServerContext* c, const v1::SaveCheckpointRequest* req,
                                           v1::SaveCheckpointResponse* resp) override {
    // Names a path: controller-only when roles are on (libs/rpc/auth.h).
    return rpc::HandleUnary(c, auth_, rpc::Role::kController, "SaveCheckpoint",
                            [&] { return core_->SaveCheckpoint(*req, resp); });
  }
  grpc::ServerUnaryReactor* LoadCheckpoint(grpc::CallbackServerContext* c, const v1::LoadCheckpointRequest* req,
                                           v1::LoadCheckpointResponse* resp) override {
    return rpc::HandleUnary(c, auth_, rpc::Role::kController, "LoadCheckpoint",
                            [&] { return core_->LoadCheckpoint(*req, resp); });
  }
  grpc::ServerUnaryReactor* PublishWeights(grpc::CallbackServerContext* c, const v1::PublishWeightsRequest* req,
                                           v1::PublishWeightsResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&]() -> absl::Status {
      bool republished = false;
      RETURN_IF_ERROR(core_->Publish(publish_, *req, resp, &republished));
      if (weights_ == nullptr) return absl::OkStatus();
      const uint64_t version = resp->version().version();
      // idempotent: a version already handed on is not handed on again.
      if (republished && handed_off_.load() == version) return absl::OkStatus();
      const absl::Duration timeout =
          req->timeout_ms() > 0 ? absl::Milliseconds(req->timeout_ms()) : kDefaultHandOffTimeout;
      RETURN_IF_ERROR(common::Annotate(weights_->HandOff(*resp, timeout),
                                       absl::StrCat("handing version ", version, " to the weights service")));
      handed_off_.store(version);
      return absl::OkStatus();
    });
  }

 private:
  TrainerCore* const core_;
  const rpc::CallAuth auth_;
  const TrainerCore::PublishTarget publish_;
  WeightsSink* const weights_;
  std::atomic<uint64_t> handed_off_{0};  // the latest version the weights service took
};

}  // namespace rlfleet::trainer

#endif  // RLFLEET_SERVICES_TRAINER_TRAINER_SERVICE_H_

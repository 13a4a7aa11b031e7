#include "services/controller/controller_service.h"

#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "libs/common/checks.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/status_conversion.h"
#include "services/controller/reward_routes.h"

namespace rlfleet::controller {
namespace {

// Longest StopRun grace period, in ms (the call waits that long).
constexpr int64_t kMaxGraceMs = 600000;

absl::Status NoRuns() {
  return absl::FailedPreconditionError(
      "this controller runs no RL loop: start it with --rollout, --reward, --buffer and --trainer");
}

// Streams a registry subscription. A detached worker thread waits for events and
// writes them one at a time (StartWrite, then OnWriteDone); the stream ends when the
// client cancels (CANCELLED) or the subscription closes (server stopping, or the
// watcher fell too far behind: UNAVAILABLE, re-watch with a snapshot). The worker
// touches the reactor last in Finish; OnDone deletes it.
class WatchReactor : public grpc::ServerWriteReactor<v1::ReplicaEvent> {
 public:
  explicit WatchReactor(std::shared_ptr<registry::Subscription> sub) : sub_(std::move(sub)) {
    std::thread([this] { Run(); }).detach();
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) broken_ = true;
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  void OnDone() override { delete this; }

 private:
  void Run() {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (cancelled_ || broken_) break;
      }
      std::optional<v1::ReplicaEvent> event = sub_->Next(absl::Milliseconds(200));
      if (!event) {
        if (sub_->closed()) {
          sub_->Close();
          Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "watch closed (server stopping or watcher too far behind): re-watch "
                              "with send_snapshot"));
          return;
        }
        continue;
      }
      absl::MutexLock lock(&mu_);
      event_ = std::move(*event);
      writing_ = true;
      StartWrite(&event_);
      auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !writing_ || cancelled_; };
      mu_.Await(absl::Condition(&done));
    }
    sub_->Close();
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
  }

  const std::shared_ptr<registry::Subscription> sub_;
  absl::Mutex mu_;
  v1::ReplicaEvent event_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerWriteReactor<v1::ReplicaEvent>* RegistryServiceImpl::WatchReplicas(
    grpc::CallbackServerContext* context, const v1::WatchReplicasRequest* request) {
  using Failed = rpc::FinishedStream<grpc::ServerWriteReactor<v1::ReplicaEvent>>;
  if (absl::Status s = rpc::Authorize(*context, auth_, rpc::Role::kInference, "WatchReplicas"); !s.ok()) {
    return new Failed(rpc::ToGrpcStatus(s));
  }
  absl::StatusOr<std::shared_ptr<registry::Subscription>> sub = core_->Watch(*request);
  if (!sub.ok()) return new Failed(rpc::ToGrpcStatus(sub.status()));
  return new WatchReactor(std::move(*sub));
}

grpc::ServerUnaryReactor* RegistryServiceImpl::Register(grpc::CallbackServerContext* context,
                                                        const v1::RegisterRequest* request,
                                                        v1::RegisterResponse* response) {
  // A reward replica that names tasks takes those tasks' items from every run
  // (reward_routes.h): only the controller role may register one, so a fleet member's
  // token cannot route a run's rewards to itself.
  if (request->replica().labels().contains(kRewardTasksLabel)) {
    return rpc::HandleUnary(context, auth_, rpc::Role::kController,
                            absl::StrCat("Register with label ", kRewardTasksLabel),
                            [&] { return core_->Register(*request, response); });
  }
  return rpc::HandleUnary(context, auth_, rpc::Role::kFleet, "Register",
                          [&] { return core_->Register(*request, response); });
}

grpc::ServerUnaryReactor* RegistryServiceImpl::Heartbeat(grpc::CallbackServerContext* context,
                                                         const v1::HeartbeatRequest* request,
                                                         v1::HeartbeatResponse* response) {
  // Answered when the registry has the heartbeat, without holding a gRPC thread meanwhile.
  return rpc::HandleUnaryAsync(context, auth_, rpc::Role::kFleet, "Heartbeat",
                               [&](auto finish) { core_->HeartbeatAsync(*request, response, std::move(finish)); });
}

grpc::ServerUnaryReactor* RegistryServiceImpl::Deregister(grpc::CallbackServerContext* context,
                                                          const v1::DeregisterRequest* request,
                                                          v1::DeregisterResponse* response) {
  return rpc::HandleUnary(context, auth_, rpc::Role::kFleet, "Deregister",
                          [&] { return core_->Deregister(*request, response); });
}

grpc::ServerUnaryReactor* RegistryServiceImpl::ListReplicas(grpc::CallbackServerContext* context,
                                                            const v1::ListReplicasRequest* request,
                                                            v1::ListReplicasResponse* response) {
  return rpc::HandleUnary(context, auth_, rpc::Role::kInference, "ListReplicas",
                          [&] { return core_->ListReplicas(*request, response); });
}

grpc::ServerUnaryReactor* ControllerServiceImpl::GetStatus(grpc::CallbackServerContext* context,
                                                           const v1::GetStatusRequest* request,
                                                           v1::GetStatusResponse* response) {
  return rpc::HandleUnary(context, auth_, [&] {
    absl::Status s = core_->GetStatus(*request, response);
    if (s.ok() && runs_ != nullptr) runs_->Fill(response);
    return s;
  });
}

grpc::ServerUnaryReactor* ControllerServiceImpl::StartRun(grpc::CallbackServerContext* context,
                                                          const v1::StartRunRequest* request,
                                                          v1::StartRunResponse* response) {
  return rpc::HandleUnary(context, auth_, rpc::Role::kController, "StartRun", [&]() -> absl::Status {
    if (runs_ == nullptr) return NoRuns();
    absl::StatusOr<std::string> id = runs_->Start(request->config(), request->run_id());
    if (!id.ok()) return id.status();
    response->set_run_id(*id);
    response->set_state(v1::RUN_STATE_STARTING);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ControllerServiceImpl::StopRun(grpc::CallbackServerContext* context,
                                                         const v1::StopRunRequest* request,
                                                         v1::StopRunResponse* response) {
  return rpc::HandleUnary(context, auth_, rpc::Role::kController, "StopRun", [&]() -> absl::Status {
    if (runs_ == nullptr) return NoRuns();
    RETURN_IF_ERROR(common::CheckInRange<int64_t>("grace_ms", request->grace_ms(), 0, kMaxGraceMs));
    const absl::Duration grace = absl::Milliseconds(request->grace_ms() == 0 ? 30000 : request->grace_ms());
    return runs_->Stop(request->run_id(), request->checkpoint(), grace, response);
  });
}

grpc::ServerUnaryReactor* ControllerServiceImpl::Scale(grpc::CallbackServerContext* context,
                                                       const v1::ScaleRequest* request, v1::ScaleResponse* response) {
  return rpc::HandleUnary(context, auth_, rpc::Role::kController, "Scale",
                          [&] { return core_->Scale(*request, response); });
}

}  // namespace rlfleet::controller

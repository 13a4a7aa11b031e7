#include "services/controller/controller_service.h"

namespace rlfleet::controller {
namespace {

absl::Status NotYet(absl::string_view rpc) {
  return absl::UnimplementedError(absl::StrCat(
      rpc, " is not available yet: replicas are the controller's --rollout list for now"));
}

absl::Status NoRuns() {
  return absl::FailedPreconditionError(
      "this controller runs no RL loop: start it with --rollout, --reward, --buffer and --trainer");
}

}  // namespace

grpc::ServerUnaryReactor* RegistryServiceImpl::Register(grpc::CallbackServerContext* context,
                                                        const v1::RegisterRequest* request,
                                                        v1::RegisterResponse* response) {
  return rpc::HandleUnary(context, auth_, [&] { return core_->Register(*request, response); });
}

grpc::ServerUnaryReactor* RegistryServiceImpl::Heartbeat(grpc::CallbackServerContext* context,
                                                         const v1::HeartbeatRequest* request,
                                                         v1::HeartbeatResponse* response) {
  return rpc::HandleUnary(context, auth_, [&] { return core_->Heartbeat(*request, response); });
}

grpc::ServerUnaryReactor* RegistryServiceImpl::Deregister(grpc::CallbackServerContext* context,
                                                          const v1::DeregisterRequest* request,
                                                          v1::DeregisterResponse* response) {
  return rpc::HandleUnary(context, auth_, [&] { return core_->Deregister(*request, response); });
}

grpc::ServerUnaryReactor* RegistryServiceImpl::ListReplicas(
    grpc::CallbackServerContext* context, const v1::ListReplicasRequest* request,
    v1::ListReplicasResponse* response) {
  return rpc::HandleUnary(context, auth_,
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
  return rpc::HandleUnary(context, auth_, [&]() -> absl::Status {
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
  return rpc::HandleUnary(context, auth_, [&]() -> absl::Status {
    if (runs_ == nullptr) return NoRuns();
    if (request->checkpoint()) {
      return absl::UnimplementedError("checkpoint: checkpoints at StopRun are not implemented yet");
    }
    if (request->grace_ms() < 0) return absl::InvalidArgumentError("grace_ms: negative");
    const absl::Duration grace =
        absl::Milliseconds(std::min<int64_t>(request->grace_ms() == 0 ? 30000 : request->grace_ms(), 120000));
    return runs_->Stop(request->run_id(), grace, response);
  });
}

grpc::ServerUnaryReactor* ControllerServiceImpl::Scale(grpc::CallbackServerContext* context,
                                                       const v1::ScaleRequest*,
                                                       v1::ScaleResponse*) {
  return rpc::HandleUnary(context, auth_, [] { return NotYet("Scale"); });
}

}  // namespace rlfleet::controller

#include "services/controller/controller_service.h"

namespace rlfleet::controller {
namespace {

absl::Status NotYet(absl::string_view rpc) {
  return absl::UnimplementedError(absl::StrCat(
      rpc, " is not available yet: this controller serves the registry and status; the RL "
           "loop (StartRun / StopRun / Scale) lands with the controller issue"));
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
  return rpc::HandleUnary(context, auth_, [&] { return core_->GetStatus(*request, response); });
}

grpc::ServerUnaryReactor* ControllerServiceImpl::StartRun(grpc::CallbackServerContext* context,
                                                          const v1::StartRunRequest*,
                                                          v1::StartRunResponse*) {
  return rpc::HandleUnary(context, auth_, [] { return NotYet("StartRun"); });
}

grpc::ServerUnaryReactor* ControllerServiceImpl::StopRun(grpc::CallbackServerContext* context,
                                                         const v1::StopRunRequest*,
                                                         v1::StopRunResponse*) {
  return rpc::HandleUnary(context, auth_, [] { return NotYet("StopRun"); });
}

grpc::ServerUnaryReactor* ControllerServiceImpl::Scale(grpc::CallbackServerContext* context,
                                                       const v1::ScaleRequest*,
                                                       v1::ScaleResponse*) {
  return rpc::HandleUnary(context, auth_, [] { return NotYet("Scale"); });
}

}  // namespace rlfleet::controller

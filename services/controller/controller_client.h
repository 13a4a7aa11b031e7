// Typed client for the controller's RegistryService and ControllerService, plus the
// standard health check. Deadlines and retries come from rpc::ClientBase. Thread-safe.
#ifndef RLFLEET_SERVICES_CONTROLLER_CONTROLLER_CLIENT_H_
#define RLFLEET_SERVICES_CONTROLLER_CONTROLLER_CLIENT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "libs/rpc/client.h"
#include "rlfleet/v1/controller.grpc.pb.h"

namespace rlfleet::controller {

class ControllerClient : public rpc::ClientBase {
 public:
  ControllerClient(std::shared_ptr<grpc::Channel> channel, rpc::ClientOptions options)
      : ClientBase(channel, std::move(options)),
        registry_(v1::RegistryService::NewStub(channel)),
        controller_(v1::ControllerService::NewStub(channel)),
        health_(grpc::health::v1::Health::NewStub(channel)) {}

  // Connects to options.target. Errors as rpc::MakeChannel.
  static absl::StatusOr<std::unique_ptr<ControllerClient>> Connect(rpc::ClientOptions options) {
    auto channel = rpc::MakeChannel(options);
    if (!channel.ok()) return channel.status();
    return std::make_unique<ControllerClient>(*channel, std::move(options));
  }

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) {
    return Unary<v1::RegisterResponse>(
        "Register", [&](grpc::ClientContext* c, auto* r) { return registry_->Register(c, request, r); });
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request) {
    return Unary<v1::HeartbeatResponse>(
        "Heartbeat", [&](grpc::ClientContext* c, auto* r) { return registry_->Heartbeat(c, request, r); });
  }
  absl::StatusOr<v1::DeregisterResponse> Deregister(const v1::DeregisterRequest& request) {
    return Unary<v1::DeregisterResponse>(
        "Deregister", [&](grpc::ClientContext* c, auto* r) { return registry_->Deregister(c, request, r); });
  }
  absl::StatusOr<v1::ListReplicasResponse> ListReplicas(const v1::ListReplicasRequest& request) {
    return Unary<v1::ListReplicasResponse>(
        "ListReplicas", [&](grpc::ClientContext* c, auto* r) { return registry_->ListReplicas(c, request, r); });
  }
  absl::StatusOr<v1::GetStatusResponse> GetStatus() {
    v1::GetStatusRequest request;
    return Unary<v1::GetStatusResponse>(
        "GetStatus", [&](grpc::ClientContext* c, auto* r) { return controller_->GetStatus(c, request, r); });
  }
  absl::StatusOr<v1::StartRunResponse> StartRun(const v1::StartRunRequest& request) {
    return Unary<v1::StartRunResponse>(
        "StartRun", [&](grpc::ClientContext* c, auto* r) { return controller_->StartRun(c, request, r); });
  }
  absl::StatusOr<v1::ScaleResponse> Scale(const v1::ScaleRequest& request) {
    return Unary<v1::ScaleResponse>("Scale",
                                    [&](grpc::ClientContext* c, auto* r) { return controller_->Scale(c, request, r); });
  }
  absl::StatusOr<v1::StopRunResponse> StopRun(const v1::StopRunRequest& request) {
    return Unary<v1::StopRunResponse>(
        "StopRun", [&](grpc::ClientContext* c, auto* r) { return controller_->StopRun(c, request, r); });
  }
  // The server's overall health (grpc.health.v1, service "").
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> CheckHealth() {
    grpc::health::v1::HealthCheckRequest request;
    return Unary<grpc::health::v1::HealthCheckResponse>(
        "Health.Check", [&](grpc::ClientContext* c, auto* r) { return health_->Check(c, request, r); });
  }

 private:
  template <typename Response, typename Fn>
  absl::StatusOr<Response> Unary(absl::string_view method, Fn&& fn) {
    Response response;
    absl::Status status = Call(method, [&](grpc::ClientContext* context) { return fn(context, &response); });
    if (!status.ok()) return status;
    return response;
  }

  std::unique_ptr<v1::RegistryService::Stub> registry_;
  std::unique_ptr<v1::ControllerService::Stub> controller_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_CONTROLLER_CLIENT_H_

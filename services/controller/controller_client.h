// Typed client for the controller's RegistryService and ControllerService, plus the
// standard health check. Deadlines and retries come from rpc::ClientBase; StartRun is
// the one call sent only once. Thread-safe.
#ifndef RLFLEET_SERVICES_CONTROLLER_CONTROLLER_CLIENT_H_
#define RLFLEET_SERVICES_CONTROLLER_CONTROLLER_CLIENT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "libs/registry/registry_client.h"
#include "libs/rpc/client.h"
#include "rlfleet/v1/controller.grpc.pb.h"

namespace rlfleet::controller {

class ControllerClient : public registry::RegistryClient {
 public:
  ControllerClient(std::shared_ptr<grpc::Channel> channel, rpc::ClientOptions options)
      : RegistryClient(channel, std::move(options)),
        controller_(v1::ControllerService::NewStub(channel)),
        health_(grpc::health::v1::Health::NewStub(channel)) {}

  // Connects to options.target. Errors as rpc::MakeChannel.
  static absl::StatusOr<std::unique_ptr<ControllerClient>> Connect(rpc::ClientOptions options) {
    auto channel = rpc::MakeChannel(options);
    if (!channel.ok()) return channel.status();
    return std::make_unique<ControllerClient>(*channel, std::move(options));
  }

  absl::StatusOr<v1::GetStatusResponse> GetStatus() {
    v1::GetStatusRequest request;
    return CallFor<v1::GetStatusResponse>("GetStatus", rpc::Retry::kIdempotent, [&](grpc::ClientContext* c, auto* r) {
      return controller_->GetStatus(c, request, r);
    });
  }
  // Once: a StartRun the controller took but whose answer was lost must not be sent
  // again (the second would be refused: "run ... is active; StopRun it first").
  absl::StatusOr<v1::StartRunResponse> StartRun(const v1::StartRunRequest& request) {
    return CallFor<v1::StartRunResponse>("StartRun", rpc::Retry::kOnce, [&](grpc::ClientContext* c, auto* r) {
      return controller_->StartRun(c, request, r);
    });
  }
  absl::StatusOr<v1::ScaleResponse> Scale(const v1::ScaleRequest& request) {  // (a target count: idempotent)
    return CallFor<v1::ScaleResponse>("Scale", rpc::Retry::kIdempotent, [&](grpc::ClientContext* c, auto* r) {
      return controller_->Scale(c, request, r);
    });
  }
  absl::StatusOr<v1::StopRunResponse> StopRun(const v1::StopRunRequest& request) {
    return CallFor<v1::StopRunResponse>("StopRun", rpc::Retry::kIdempotent, [&](grpc::ClientContext* c, auto* r) {
      return controller_->StopRun(c, request, r);
    });
  }
  // The server's overall health (grpc.health.v1, service "").
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> CheckHealth() {
    grpc::health::v1::HealthCheckRequest request;
    return CallFor<grpc::health::v1::HealthCheckResponse>(
        "Health.Check", rpc::Retry::kIdempotent,
        [&](grpc::ClientContext* c, auto* r) { return health_->Check(c, request, r); });
  }

 private:
  const std::unique_ptr<v1::ControllerService::Stub> controller_;
  const std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_CONTROLLER_CLIENT_H_

// Typed client of the controller's RegistryService (Register, Heartbeat, Deregister,
// ListReplicas), with the client base's deadlines and retries: every registry call is
// idempotent by replica id (a second Register of the same id from the same address
// replaces the first lease).
// The registrar and the controller's own client build on it. Thread-safe.
#ifndef RLFLEET_LIBS_REGISTRY_REGISTRY_CLIENT_H_
#define RLFLEET_LIBS_REGISTRY_REGISTRY_CLIENT_H_

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "libs/rpc/client.h"
#include "rlfleet/v1/controller.grpc.pb.h"

namespace rlfleet::registry {

class RegistryClient : public rpc::ClientBase {
 public:
  RegistryClient(std::shared_ptr<grpc::Channel> channel, rpc::ClientOptions options)
      : ClientBase(channel, std::move(options)), registry_(v1::RegistryService::NewStub(channel)) {}

  // A client of options.target. Errors as rpc::MakeChannel.
  static absl::StatusOr<std::unique_ptr<RegistryClient>> Connect(rpc::ClientOptions options) {
    auto channel = rpc::MakeChannel(options);
    if (!channel.ok()) return channel.status();
    return std::make_unique<RegistryClient>(*channel, std::move(options));
  }

  // `timeout` zero: options().default_timeout.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request,
                                                absl::Duration timeout = absl::ZeroDuration()) {
    return CallFor<v1::RegisterResponse>(
        "Register", rpc::Retry::kIdempotent,
        [&](grpc::ClientContext* c, auto* r) { return registry_->Register(c, request, r); }, timeout);
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                                  absl::Duration timeout = absl::ZeroDuration()) {
    return CallFor<v1::HeartbeatResponse>(
        "Heartbeat", rpc::Retry::kIdempotent,
        [&](grpc::ClientContext* c, auto* r) { return registry_->Heartbeat(c, request, r); }, timeout);
  }
  absl::StatusOr<v1::DeregisterResponse> Deregister(const v1::DeregisterRequest& request,
                                                    absl::Duration timeout = absl::ZeroDuration()) {
    return CallFor<v1::DeregisterResponse>(
        "Deregister", rpc::Retry::kIdempotent,
        [&](grpc::ClientContext* c, auto* r) { return registry_->Deregister(c, request, r); }, timeout);
  }
  absl::StatusOr<v1::ListReplicasResponse> ListReplicas(const v1::ListReplicasRequest& request) {
    return CallFor<v1::ListReplicasResponse>(
        "ListReplicas", rpc::Retry::kIdempotent,
        [&](grpc::ClientContext* c, auto* r) { return registry_->ListReplicas(c, request, r); });
  }

 private:
  const std::unique_ptr<v1::RegistryService::Stub> registry_;
};

}  // namespace rlfleet::registry

#endif  // RLFLEET_LIBS_REGISTRY_REGISTRY_CLIENT_H_

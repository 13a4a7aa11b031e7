// gRPC adapter for ControllerCore: RegistryService and ControllerService. Converts
// requests to core calls and statuses to gRPC statuses; checks the bearer token.
// Thread-safe.
#ifndef RLFLEET_SERVICES_CONTROLLER_CONTROLLER_SERVICE_H_
#define RLFLEET_SERVICES_CONTROLLER_CONTROLLER_SERVICE_H_

#include "libs/rpc/server_call.h"
#include "rlfleet/v1/controller.grpc.pb.h"
#include "services/controller/controller_core.h"
#include "services/controller/run_manager.h"

namespace rlfleet::controller {

class RegistryServiceImpl final : public v1::RegistryService::CallbackService {
 public:
  RegistryServiceImpl(ControllerCore* core, rpc::CallAuth auth) : core_(core), auth_(auth) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context, const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Deregister(grpc::CallbackServerContext* context, const v1::DeregisterRequest* request,
                                       v1::DeregisterResponse* response) override;
  grpc::ServerUnaryReactor* ListReplicas(grpc::CallbackServerContext* context, const v1::ListReplicasRequest* request,
                                         v1::ListReplicasResponse* response) override;
  grpc::ServerWriteReactor<v1::ReplicaEvent>* WatchReplicas(grpc::CallbackServerContext* context,
                                                            const v1::WatchReplicasRequest* request) override;

 private:
  ControllerCore* const core_;
  const rpc::CallAuth auth_;
};

class ControllerServiceImpl final : public v1::ControllerService::CallbackService {
 public:
  // `runs` (may be null: StartRun is then FAILED_PRECONDITION) runs the RL loop.
  ControllerServiceImpl(ControllerCore* core, RunManager* runs, rpc::CallAuth auth)
      : core_(core), runs_(runs), auth_(auth) {}

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context, const v1::GetStatusRequest* request,
                                      v1::GetStatusResponse* response) override;
  grpc::ServerUnaryReactor* StartRun(grpc::CallbackServerContext* context, const v1::StartRunRequest* request,
                                     v1::StartRunResponse* response) override;
  grpc::ServerUnaryReactor* StopRun(grpc::CallbackServerContext* context, const v1::StopRunRequest* request,
                                    v1::StopRunResponse* response) override;
  grpc::ServerUnaryReactor* Scale(grpc::CallbackServerContext* context, const v1::ScaleRequest* request,
                                  v1::ScaleResponse* response) override;

 private:
  ControllerCore* const core_;
  RunManager* const runs_;
  const rpc::CallAuth auth_;
};

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_CONTROLLER_SERVICE_H_

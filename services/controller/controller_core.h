// ControllerCore: the controller's registry logic without gRPC: replicas register,
// heartbeat, are listed and watched, and the fleet status. (Runs: run_manager.h.)
// Thread-safe.
#ifndef RLFLEET_SERVICES_CONTROLLER_CONTROLLER_CORE_H_
#define RLFLEET_SERVICES_CONTROLLER_CONTROLLER_CORE_H_

#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/common/clock.h"
#include "libs/registry/registry.h"
#include "libs/registry/watch.h"
#include "rlfleet/v1/controller.pb.h"

namespace rlfleet::controller {

// Where the desired replica counts (Scale) are kept, so that a restarted controller
// reports the same ones (RunStore: in Redis beside the run's record).
class DesiredCountStore {
 public:
  virtual ~DesiredCountStore() = default;
  // Replaces the saved counts (role -> count). UNAVAILABLE when the store cannot be
  // reached.
  virtual absl::Status SaveDesired(const std::map<int, uint32_t>& desired) = 0;
  // The counts saved last (empty when none). DATA_LOSS naming the entry for one that
  // does not read.
  virtual absl::StatusOr<std::map<int, uint32_t>> LoadDesired() = 0;
};

// Largest ListReplicas page.
inline constexpr uint32_t kMaxPageSize = 1000;
inline constexpr uint32_t kDefaultPageSize = 100;

class ControllerCore {
 public:
  // `registry` and `clock` are not owned and must outlive the core.
  ControllerCore(registry::Registry* registry, common::Clock* clock);

  // Registry RPCs; errors as documented in controller.proto (INVALID_ARGUMENT naming
  // the field, NOT_FOUND for an expired lease).
  absl::Status Register(const v1::RegisterRequest& request, v1::RegisterResponse* response);
  absl::Status Heartbeat(const v1::HeartbeatRequest& request, v1::HeartbeatResponse* response);
  // The same without blocking: `done` runs once (on this thread or the registry's) with
  // the result, `*response` filled when it is OK. The gRPC handler's path.
  void HeartbeatAsync(const v1::HeartbeatRequest& request, v1::HeartbeatResponse* response,
                      std::function<void(absl::Status)> done);
  absl::Status Deregister(const v1::DeregisterRequest& request, v1::DeregisterResponse* response);
  absl::Status ListReplicas(const v1::ListReplicasRequest& request, v1::ListReplicasResponse* response);

  // Fleet status: run state (IDLE until a run exists) and replicas per role.
  absl::Status GetStatus(const v1::GetStatusRequest& request, v1::GetStatusResponse* response);

  // Desired replica counts (Scale): the launcher (local) or an autoscaler reads them
  // from GetStatus and starts or stops replicas. INVALID_ARGUMENT for a role that is
  // not scaled (UNSPECIFIED, BUFFER, CONTROLLER) or a count over 1024;
  // FAILED_PRECONDITION without a scaler attached (SetScaler).
  absl::Status Scale(const v1::ScaleRequest& request, v1::ScaleResponse* response);
  // Names what acts on Scale (e.g. "launcher"); empty: nothing does.
  void SetScaler(std::string scaler);
  // Keeps the desired counts in `store` (not owned; outlives the core) from now on, and
  // takes the counts saved there (a restarted controller). Errors from loading them
  // (the core then starts with none).
  absl::Status UseDesiredStore(DesiredCountStore* store);

  // Registry changes (WatchReplicas). INVALID_ARGUMENT for an unknown role.
  absl::StatusOr<std::shared_ptr<registry::Subscription>> Watch(const v1::WatchReplicasRequest& request);
  // Polls the registry for WatchReplicas every `interval` (a thread until destruction).
  void StartWatching(absl::Duration interval);

 private:
  registry::Registry* const registry_;
  common::Clock* const clock_;
  registry::RegistryWatch watch_;
  absl::Mutex mu_;
  std::string scaler_ ABSL_GUARDED_BY(mu_);
  std::map<int, uint32_t> desired_ ABSL_GUARDED_BY(mu_);  // role -> count, once Scale set it
  // One Scale at a time, so that the counts saved last are the counts held.
  absl::Mutex scale_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  DesiredCountStore* desired_store_ ABSL_GUARDED_BY(scale_mu_) = nullptr;
};

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_CONTROLLER_CORE_H_

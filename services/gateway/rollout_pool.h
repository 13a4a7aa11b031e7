// The gateway's GenerateBackend over gRPC: the rollout replicas, either a fixed list
// (--rollouts) or those the controller's registry lists as admitted rollout replicas
// (refreshed at most every second). Requests go round-robin; a replica that is
// UNAVAILABLE before it sent anything is skipped for the next one. Shutdown cancels
// every call in flight and refuses new ones. Thread-safe.
#ifndef RLFLEET_SERVICES_GATEWAY_ROLLOUT_POOL_H_
#define RLFLEET_SERVICES_GATEWAY_ROLLOUT_POOL_H_

#include <grpcpp/client_context.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "libs/registry/registry_client.h"
#include "libs/rpc/client.h"
#include "rlfleet/v1/rollout.grpc.pb.h"
#include "services/gateway/gateway_core.h"

namespace rlfleet::gateway {

class RolloutPool : public GenerateBackend {
 public:
  // `fixed`: replica addresses (then `registry` may be null). `client`: auth and
  // message limits of the calls (its target is ignored).
  RolloutPool(std::vector<std::string> fixed, std::unique_ptr<registry::RegistryClient> registry,
              rpc::ClientOptions client);

  absl::Status Generate(const v1::GenerateRequest& request, absl::Time deadline,
                        const std::function<bool(const v1::GenerateResponse&)>& on_message) override;
  // The replicas requests would go to now. UNAVAILABLE when the registry cannot be read.
  absl::StatusOr<std::vector<std::string>> Replicas();
  void Shutdown();

 private:
  v1::RolloutService::Stub* StubFor(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<std::string> fixed_;
  const std::unique_ptr<registry::RegistryClient> registry_;
  const rpc::ClientOptions client_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> listed_ ABSL_GUARDED_BY(mu_);
  absl::Time listed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<std::string, std::unique_ptr<v1::RolloutService::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlfleet::gateway

#endif  // RLFLEET_SERVICES_GATEWAY_ROLLOUT_POOL_H_

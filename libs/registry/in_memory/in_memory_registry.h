// In-process registry backend (`memory://`): for tests and single-process runs.
// Leases expire lazily, measured on the injected clock, so tests drive expiry by hand.
// Thread-safe.
#ifndef RLFLEET_LIBS_REGISTRY_IN_MEMORY_IN_MEMORY_REGISTRY_H_
#define RLFLEET_LIBS_REGISTRY_IN_MEMORY_IN_MEMORY_REGISTRY_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "libs/registry/registry.h"

namespace rlfleet::registry {

class InMemoryRegistry : public Registry {
 public:
  explicit InMemoryRegistry(common::Clock* clock, RegistryLimits limits = {}) : clock_(clock), limits_(limits) {}

  absl::StatusOr<Lease> Register(const v1::ReplicaInfo& replica, absl::Duration ttl) override;
  absl::StatusOr<HeartbeatResult> Heartbeat(absl::string_view replica_id, absl::string_view lease_id,
                                            const v1::LoadStats& load, const v1::PolicyVersion& version) override;
  absl::StatusOr<bool> Deregister(absl::string_view replica_id, absl::string_view lease_id) override;
  absl::StatusOr<std::vector<v1::ReplicaInfo>> List(v1::ReplicaRole role, bool only_admitted) override;

 private:
  struct Entry {
    v1::ReplicaInfo replica;
    std::string lease_id;
    absl::Duration ttl;
    absl::Time expires_at;
  };

  // Drops entries whose lease has expired.
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  common::Clock* const clock_;
  const RegistryLimits limits_;
  absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);  // by replica id
};

}  // namespace rlfleet::registry

#endif  // RLFLEET_LIBS_REGISTRY_IN_MEMORY_IN_MEMORY_REGISTRY_H_

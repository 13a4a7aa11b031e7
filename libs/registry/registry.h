// The replica registry: every service replica registers its role, address, policy
// version and load under a lease that it renews by heartbeat; the controller discovers
// and load-balances from it. A replica is admitted to receive work once it reports a
// verified weight version (rollout) or at once (roles that hold no weights).
//
// Backends are chosen by connection string (OpenRegistry): `memory://` (in-process,
// for tests and the single-process demo) and `redis://host:port[/key-prefix]`.
#ifndef RLFLEET_LIBS_REGISTRY_REGISTRY_H_
#define RLFLEET_LIBS_REGISTRY_REGISTRY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/common/clock.h"
#include "libs/registry/load.h"
#include "rlfleet/v1/common.pb.h"

namespace rlfleet::registry {

inline constexpr absl::Duration kMinTtl = absl::Seconds(1);
inline constexpr absl::Duration kMaxTtl = absl::Minutes(5);
inline constexpr absl::Duration kDefaultTtl = absl::Seconds(10);

// What one registration may carry (controller.proto's limits). Labels: at most
// kMaxLabels entries, keys 1..kMaxLabelKeyBytes, values up to kMaxLabelValueBytes,
// kMaxLabelBytes in all.
inline constexpr int kMaxLabels = 32;
inline constexpr size_t kMaxLabelKeyBytes = 128;
inline constexpr size_t kMaxLabelValueBytes = 1024;
inline constexpr size_t kMaxLabelBytes = 8192;
inline constexpr int kMaxDataPlaneEndpoints = 64;

// Bounds a registry holds every registration to.
struct RegistryLimits {
  // Live registrations of one role at most (a new id past it: RESOURCE_EXHAUSTED).
  int max_live_per_role = 16384;
};

struct Lease {
  std::string lease_id;
  absl::Duration ttl;
  v1::ReplicaInfo replica;  // as stored
};

struct HeartbeatResult {
  absl::Duration ttl;
  bool admitted = false;
};

// Thread-safe in every implementation.
class Registry {
 public:
  virtual ~Registry() = default;

  // Registers `replica` under a new lease of `ttl` (zero = kDefaultTtl). An earlier
  // registration of the same id is replaced when its lease has expired or it was made
  // from the same grpc_address (a restarted replica, or a retried call); while it is
  // live under another address the call is ALREADY_EXISTS naming the id and the holder's
  // address, and the holder keeps its lease. INVALID_ARGUMENT naming the field for a bad
  // id, role, address, labels, load or a ttl outside [kMinTtl, kMaxTtl]
  // (ValidateRegistration); RESOURCE_EXHAUSTED for a new id when its role already has
  // RegistryLimits::max_live_per_role live registrations; UNAVAILABLE if the store is down.
  virtual absl::StatusOr<Lease> Register(const v1::ReplicaInfo& replica, absl::Duration ttl) = 0;

  // Renews the lease and records load and policy version. NOT_FOUND if the lease is
  // unknown or expired (the replica must register again); INVALID_ARGUMENT naming the
  // field for bad ids, load or version (ValidateHeartbeat).
  virtual absl::StatusOr<HeartbeatResult> Heartbeat(absl::string_view replica_id, absl::string_view lease_id,
                                                    const v1::LoadStats& load, const v1::PolicyVersion& version) = 0;

  // Heartbeat without blocking the caller (a gRPC handler: thousands of replicas
  // heartbeat one controller): `done` runs once with the result, on this thread or
  // another; it must not block. This default answers inline with Heartbeat.
  using HeartbeatDone = std::function<void(absl::StatusOr<HeartbeatResult>)>;
  virtual void HeartbeatAsync(absl::string_view replica_id, absl::string_view lease_id, const v1::LoadStats& load,
                              const v1::PolicyVersion& version, HeartbeatDone done) {
    done(Heartbeat(replica_id, lease_id, load, version));
  }

  // Removes the registration. Returns false (not an error) if there was none, so that
  // repeating it is safe. INVALID_ARGUMENT for bad ids.
  virtual absl::StatusOr<bool> Deregister(absl::string_view replica_id, absl::string_view lease_id) = 0;

  // Live replicas of `role` (UNSPECIFIED = all), ordered by replica id.
  virtual absl::StatusOr<std::vector<v1::ReplicaInfo>> List(v1::ReplicaRole role, bool only_admitted) = 0;
};

// Opens a registry from a connection string. INVALID_ARGUMENT for an unknown scheme or
// a malformed address; UNAVAILABLE if Redis cannot be reached. `clock` is not owned.
absl::StatusOr<std::unique_ptr<Registry>> OpenRegistry(absl::string_view connection, common::Clock* clock,
                                                       RegistryLimits limits = {});

// Shared validation of a registration: INVALID_ARGUMENT naming the field (id, role,
// address, ttl, labels, data-plane endpoints, run id, load, policy version).
absl::Status ValidateRegistration(const v1::ReplicaInfo& replica, absl::Duration ttl);

// The errors both backends return: ALREADY_EXISTS for an id whose live lease is held
// from `holder_address`; RESOURCE_EXHAUSTED for a role at its live-registration cap.
absl::Status IdHeldError(absl::string_view replica_id, absl::string_view holder_address,
                         absl::string_view requested_address);
absl::Status RoleFullError(v1::ReplicaRole role, int max_live_per_role);

// Whether a replica of this role with this version may receive work: rollout replicas
// need a verified weight version (> 0); other roles are admitted when registered.
bool IsAdmitted(v1::ReplicaRole role, const v1::PolicyVersion& version);

}  // namespace rlfleet::registry

#endif  // RLFLEET_LIBS_REGISTRY_REGISTRY_H_

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
#include "rlfleet/v1/common.pb.h"

namespace rlfleet::registry {

inline constexpr absl::Duration kMinTtl = absl::Seconds(1);
inline constexpr absl::Duration kMaxTtl = absl::Minutes(5);
inline constexpr absl::Duration kDefaultTtl = absl::Seconds(10);

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

  // Registers `replica` (replacing any earlier registration of the same id) under a new
  // lease of `ttl` (zero = kDefaultTtl). INVALID_ARGUMENT naming the field for a bad id,
  // role, address or a ttl outside [kMinTtl, kMaxTtl]; UNAVAILABLE if the store is down.
  virtual absl::StatusOr<Lease> Register(const v1::ReplicaInfo& replica, absl::Duration ttl) = 0;

  // Renews the lease and records load and policy version. NOT_FOUND if the lease is
  // unknown or expired (the replica must register again); INVALID_ARGUMENT for bad ids.
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
absl::StatusOr<std::unique_ptr<Registry>> OpenRegistry(absl::string_view connection, common::Clock* clock);

// Shared validation of a registration: INVALID_ARGUMENT naming the field.
absl::Status ValidateRegistration(const v1::ReplicaInfo& replica, absl::Duration ttl);

// Whether a replica of this role with this version may receive work: rollout replicas
// need a verified weight version (> 0); other roles are admitted when registered.
bool IsAdmitted(v1::ReplicaRole role, const v1::PolicyVersion& version);

}  // namespace rlfleet::registry

#endif  // RLFLEET_LIBS_REGISTRY_REGISTRY_H_

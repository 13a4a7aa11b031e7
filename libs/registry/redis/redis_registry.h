// Redis registry backend (`redis://host:port[/prefix]`), over libs/redis.
//
// Each replica is a hash `rlfleet:replica:<id>` with its ReplicaInfo (protobuf bytes),
// lease id, TTL, admission flag and absolute expiry (ms, from the injected clock, so
// that every process agrees and tests can drive time by hand); the set
// `rlfleet:replicas` indexes them, and `rlfleet:replicas:role:<n>` each role's (for the
// per-role cap). Lease checks are Lua scripts, so a stale lease
// never renews or removes a newer registration. Redis's own PEXPIRE (twice the TTL)
// collects records of replicas that vanished.
//
// A dropped connection (Redis restarted) is re-dialled on the next call; a call that
// cannot reach Redis within the timeout is UNAVAILABLE. Registrations lost in a Redis
// restart come back with the replicas' next heartbeat, which gets NOT_FOUND and
// registers again.
//
// Thread-safe.
#ifndef RLFLEET_LIBS_REGISTRY_REDIS_REDIS_REGISTRY_H_
#define RLFLEET_LIBS_REGISTRY_REDIS_REDIS_REGISTRY_H_

#include <memory>
#include <string>
#include <vector>

#include "libs/redis/redis_client.h"
#include "libs/registry/registry.h"

namespace rlfleet::registry {

class RedisRegistry : public Registry {
 public:
  // Connects to host:port. UNAVAILABLE if Redis does not answer within `timeout`.
  static absl::StatusOr<std::unique_ptr<RedisRegistry>> Connect(const std::string& host, int port, common::Clock* clock,
                                                                absl::Duration timeout = absl::Seconds(2),
                                                                std::string key_prefix = "rlfleet:",
                                                                RegistryLimits limits = {});
  ~RedisRegistry() override;

  absl::StatusOr<Lease> Register(const v1::ReplicaInfo& replica, absl::Duration ttl) override;
  absl::StatusOr<HeartbeatResult> Heartbeat(absl::string_view replica_id, absl::string_view lease_id,
                                            const v1::LoadStats& load, const v1::PolicyVersion& version) override;
  void HeartbeatAsync(absl::string_view replica_id, absl::string_view lease_id, const v1::LoadStats& load,
                      const v1::PolicyVersion& version, HeartbeatDone done) override;
  absl::StatusOr<bool> Deregister(absl::string_view replica_id, absl::string_view lease_id) override;
  absl::StatusOr<std::vector<v1::ReplicaInfo>> List(v1::ReplicaRole role, bool only_admitted) override;

 private:
  RedisRegistry(std::unique_ptr<redis::Client> client, common::Clock* clock, std::string key_prefix,
                std::string heartbeat_sha, RegistryLimits limits);
  std::string Key(absl::string_view replica_id) const;
  // The heartbeat script's reply as HeartbeatAsync's result.
  static void HeartbeatDoneWith(absl::StatusOr<redis::Reply> reply, const std::string& replica,
                                const std::string& lease, const HeartbeatDone& done);

  const std::unique_ptr<redis::Client> client_;
  common::Clock* const clock_;
  const RegistryLimits limits_;
  const std::string prefix_;
  const std::string heartbeat_sha_;  // SCRIPT LOAD's name for the heartbeat script
};

}  // namespace rlfleet::registry

#endif  // RLFLEET_LIBS_REGISTRY_REDIS_REDIS_REGISTRY_H_

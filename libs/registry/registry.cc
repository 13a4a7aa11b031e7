#include "libs/registry/registry.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"
#include "libs/redis/redis_client.h"
#include "libs/registry/in_memory/in_memory_registry.h"
#include "libs/registry/redis/redis_registry.h"

namespace rlfleet::registry {

absl::Status ValidateRegistration(const v1::ReplicaInfo& replica, absl::Duration ttl) {
  RETURN_IF_ERROR(common::ValidateId("replica.replica_id", replica.replica_id()));
  if (replica.role() == v1::REPLICA_ROLE_UNSPECIFIED || !v1::ReplicaRole_IsValid(replica.role())) {
    return absl::InvalidArgumentError(absl::StrCat("replica.role must be a known role, got ", replica.role()));
  }
  const std::string& address = replica.grpc_address();
  if (address.empty() || address.size() > 512) {
    return absl::InvalidArgumentError("replica.grpc_address must be 1..512 bytes (host:port)");
  }
  if (!absl::StrContains(address, ':')) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica.grpc_address `", address, "` is not host:port or unix:/path"));
  }
  if (ttl < kMinTtl || ttl > kMaxTtl) {
    return absl::InvalidArgumentError(absl::StrCat("ttl_ms ", absl::ToInt64Milliseconds(ttl), " is outside [",
                                                   absl::ToInt64Milliseconds(kMinTtl), ", ",
                                                   absl::ToInt64Milliseconds(kMaxTtl), "]"));
  }
  return absl::OkStatus();
}

bool IsAdmitted(v1::ReplicaRole role, const v1::PolicyVersion& version) {
  if (role == v1::REPLICA_ROLE_ROLLOUT) return version.version() > 0;
  return true;
}

absl::StatusOr<std::unique_ptr<Registry>> OpenRegistry(absl::string_view connection, common::Clock* clock) {
  if (connection == "memory://" || connection == "memory") {
    return std::unique_ptr<Registry>(new InMemoryRegistry(clock));
  }
  if (absl::StartsWith(connection, "redis://")) {
    ASSIGN_OR_RETURN(redis::Url url, redis::ParseUrl(connection, "rlfleet:"));
    ASSIGN_OR_RETURN(auto registry, RedisRegistry::Connect(url.host, url.port, clock, absl::Seconds(2), url.prefix));
    return std::unique_ptr<Registry>(std::move(registry));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown registry `", connection, "`: want memory:// or redis://host:port"));
}

}  // namespace rlfleet::registry

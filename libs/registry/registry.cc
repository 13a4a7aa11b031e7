#include "libs/registry/registry.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/common/checks.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"
#include "libs/redis/redis_client.h"
#include "libs/registry/in_memory/in_memory_registry.h"
#include "libs/registry/redis/redis_registry.h"

namespace rlfleet::registry {
namespace {

absl::Status ValidateLabels(const v1::ReplicaInfo& replica) {
  if (replica.labels_size() > kMaxLabels) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica.labels has ", replica.labels_size(), " entries; at most ", kMaxLabels));
  }
  size_t total = 0;
  for (const auto& [key, value] : replica.labels()) {
    if (key.empty() || key.size() > kMaxLabelKeyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("replica.labels key of ", key.size(), " bytes; keys are 1..", kMaxLabelKeyBytes, " bytes"));
    }
    if (value.size() > kMaxLabelValueBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("replica.labels[", key, "] is ", value.size(), " bytes; at most ", kMaxLabelValueBytes));
    }
    total += key.size() + value.size();
  }
  if (total > kMaxLabelBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica.labels hold ", total, " bytes in all; at most ", kMaxLabelBytes));
  }
  return absl::OkStatus();
}

}  // namespace

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
  RETURN_IF_ERROR(ValidateLabels(replica));
  if (replica.data_plane_endpoints_size() > kMaxDataPlaneEndpoints) {
    return absl::InvalidArgumentError(absl::StrCat("replica.data_plane_endpoints has ",
                                                   replica.data_plane_endpoints_size(), " entries; at most ",
                                                   kMaxDataPlaneEndpoints));
  }
  for (int i = 0; i < replica.data_plane_endpoints_size(); ++i) {
    const v1::Endpoint& e = replica.data_plane_endpoints(i);
    const std::string field = absl::StrCat("replica.data_plane_endpoints[", i, "]");
    if (e.host().size() > 512) return absl::InvalidArgumentError(absl::StrCat(field, ".host is over 512 bytes"));
    RETURN_IF_ERROR(common::CheckInRange<uint32_t>(absl::StrCat(field, ".port"), e.port(), 0, 65535));
    if (e.worker_address().size() > 4096) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".worker_address is over 4096 bytes"));
    }
  }
  if (replica.run_id().size() > 128) return absl::InvalidArgumentError("replica.run_id is over 128 bytes");
  RETURN_IF_ERROR(ValidateLoad(replica.load(), "replica.load"));
  RETURN_IF_ERROR(ValidateVersion(replica.policy_version(), "replica.policy_version"));
  if (ttl < kMinTtl || ttl > kMaxTtl) {
    return absl::InvalidArgumentError(absl::StrCat("ttl_ms ", absl::ToInt64Milliseconds(ttl), " is outside [",
                                                   absl::ToInt64Milliseconds(kMinTtl), ", ",
                                                   absl::ToInt64Milliseconds(kMaxTtl), "]"));
  }
  return absl::OkStatus();
}

absl::Status IdHeldError(absl::string_view replica_id, absl::string_view holder_address,
                         absl::string_view requested_address) {
  return absl::AlreadyExistsError(
      absl::StrCat("replica id ", replica_id, " is registered from ", holder_address,
                   " under a live lease; a registration from ", requested_address,
                   " cannot replace it (a replica id is unique per process: wait for the lease to expire or "
                   "register under a new id)"));
}

absl::Status RoleFullError(v1::ReplicaRole role, int max_live_per_role) {
  return absl::ResourceExhaustedError(absl::StrCat("role ", v1::ReplicaRole_Name(role), " already has ",
                                                   max_live_per_role, " live registrations (the registry's cap)"));
}

bool IsAdmitted(v1::ReplicaRole role, const v1::PolicyVersion& version) {
  if (role == v1::REPLICA_ROLE_ROLLOUT) return version.version() > 0;
  return true;
}

absl::StatusOr<std::unique_ptr<Registry>> OpenRegistry(absl::string_view connection, common::Clock* clock,
                                                       RegistryLimits limits) {
  if (limits.max_live_per_role < 1) return absl::InvalidArgumentError("max_live_per_role must be at least 1");
  if (connection == "memory://" || connection == "memory") {
    return std::unique_ptr<Registry>(new InMemoryRegistry(clock, limits));
  }
  if (absl::StartsWith(connection, "redis://")) {
    ASSIGN_OR_RETURN(redis::Url url, redis::ParseUrl(connection, "rlfleet:"));
    ASSIGN_OR_RETURN(auto registry,
                     RedisRegistry::Connect(url.host, url.port, clock, absl::Seconds(2), url.prefix, limits));
    return std::unique_ptr<Registry>(std::move(registry));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown registry `", connection, "`: want memory:// or redis://host:port"));
}

}  // namespace rlfleet::registry

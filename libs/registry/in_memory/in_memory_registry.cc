#include "libs/registry/in_memory/in_memory_registry.h"

#include "absl/strings/str_cat.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"

namespace rlfleet::registry {

void InMemoryRegistry::ExpireLocked(absl::Time now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.expires_at <= now) {
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<Lease> InMemoryRegistry::Register(const v1::ReplicaInfo& replica, absl::Duration ttl) {
  if (ttl == absl::ZeroDuration()) ttl = kDefaultTtl;
  RETURN_IF_ERROR(ValidateRegistration(replica, ttl));
  const absl::Time now = clock_->Now();
  Entry entry;
  entry.replica = replica;
  entry.replica.set_last_heartbeat_unix_ms(absl::ToUnixMillis(now));
  entry.replica.set_admitted(IsAdmitted(replica.role(), replica.policy_version()));
  entry.lease_id = common::NewId("lease");
  entry.ttl = ttl;
  entry.expires_at = now + ttl;
  Lease lease{entry.lease_id, ttl, entry.replica};
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto held = entries_.find(replica.replica_id());
  if (held != entries_.end() && held->second.replica.grpc_address() != replica.grpc_address()) {
    return IdHeldError(replica.replica_id(), held->second.replica.grpc_address(), replica.grpc_address());
  }
  if (held == entries_.end()) {
    int live = 0;
    for (const auto& [id, e] : entries_) live += e.replica.role() == replica.role() ? 1 : 0;
    if (live >= limits_.max_live_per_role) return RoleFullError(replica.role(), limits_.max_live_per_role);
  }
  entries_[replica.replica_id()] = std::move(entry);
  return lease;
}

absl::StatusOr<HeartbeatResult> InMemoryRegistry::Heartbeat(absl::string_view replica_id, absl::string_view lease_id,
                                                            const v1::LoadStats& load,
                                                            const v1::PolicyVersion& version) {
  RETURN_IF_ERROR(common::ValidateId("replica_id", replica_id));
  RETURN_IF_ERROR(common::ValidateId("lease_id", lease_id));
  RETURN_IF_ERROR(ValidateLoad(load, "load"));
  RETURN_IF_ERROR(ValidateVersion(version, "policy_version"));
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = entries_.find(std::string(replica_id));
  if (it == entries_.end() || it->second.lease_id != lease_id) {
    return absl::NotFoundError(
        absl::StrCat("no live lease ", lease_id, " for replica ", replica_id, " (expired?): register again"));
  }
  Entry& entry = it->second;
  entry.expires_at = now + entry.ttl;
  *entry.replica.mutable_load() = load;
  *entry.replica.mutable_policy_version() = version;
  entry.replica.set_last_heartbeat_unix_ms(absl::ToUnixMillis(now));
  entry.replica.set_admitted(entry.replica.admitted() || IsAdmitted(entry.replica.role(), version));
  return HeartbeatResult{entry.ttl, entry.replica.admitted()};
}

absl::StatusOr<bool> InMemoryRegistry::Deregister(absl::string_view replica_id, absl::string_view lease_id) {
  RETURN_IF_ERROR(common::ValidateId("replica_id", replica_id));
  RETURN_IF_ERROR(common::ValidateId("lease_id", lease_id));
  absl::MutexLock lock(&mu_);
  ExpireLocked(clock_->Now());
  auto it = entries_.find(std::string(replica_id));
  if (it == entries_.end() || it->second.lease_id != lease_id) return false;
  entries_.erase(it);
  return true;
}

absl::StatusOr<std::vector<v1::ReplicaInfo>> InMemoryRegistry::List(v1::ReplicaRole role, bool only_admitted) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(clock_->Now());
  std::vector<v1::ReplicaInfo> out;
  for (const auto& [id, entry] : entries_) {
    if (role != v1::REPLICA_ROLE_UNSPECIFIED && entry.replica.role() != role) continue;
    if (only_admitted && !entry.replica.admitted()) continue;
    out.push_back(entry.replica);
  }
  return out;
}

}  // namespace rlfleet::registry

#include "libs/registry/redis/redis_registry.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/common/await_callback.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"

namespace rlfleet::registry {
namespace {

using redis::Reply;

// KEYS[1] replica key, KEYS[2] index set, KEYS[3] the role's index set. ARGV: id, info,
// lease, ttl_ms, expires_ms, admitted, load, version, now_ms, address, role,
// max_live_per_role, replica key prefix.
// Returns {1} when registered; {0, holder address} when the id's live lease was taken
// from another address (nothing changes); {2} when the role is at its cap. The role's
// set is pruned of expired, removed and re-roled ids only when it looks full.
constexpr char kRegisterScript[] = R"lua(
local now = tonumber(ARGV[9])
local h = redis.call('HMGET', KEYS[1], 'addr', 'expires_ms')
local live = h[2] and tonumber(h[2]) > now
if live and h[1] and h[1] ~= ARGV[10] then return {0, h[1]} end
if not live and redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 0 and
   redis.call('SCARD', KEYS[3]) >= tonumber(ARGV[12]) then
  for _, m in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    local r = redis.call('HMGET', ARGV[13] .. m, 'expires_ms', 'role')
    if not r[1] or tonumber(r[1]) <= now or r[2] ~= ARGV[11] then redis.call('SREM', KEYS[3], m) end
  end
  if redis.call('SCARD', KEYS[3]) >= tonumber(ARGV[12]) then return {2} end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'info', ARGV[2], 'lease', ARGV[3], 'ttl_ms', ARGV[4],
           'expires_ms', ARGV[5], 'admitted', ARGV[6], 'load', ARGV[7], 'version', ARGV[8],
           'last_ms', ARGV[9], 'addr', ARGV[10], 'role', ARGV[11])
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[4]))
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
return {1}
)lua";

// KEYS[1] replica key. ARGV: lease, now_ms, load, version, admitted_now.
// Returns {0} for an unknown or expired lease, else {1, ttl_ms, admitted}.
constexpr char kHeartbeatScript[] = R"lua(
local h = redis.call('HMGET', KEYS[1], 'lease', 'expires_ms', 'ttl_ms', 'admitted')
if h[1] ~= ARGV[1] then return {0} end
if tonumber(h[2]) <= tonumber(ARGV[2]) then return {0} end
local ttl = tonumber(h[3])
local admitted = h[4]
if ARGV[5] == '1' then admitted = '1' end
redis.call('HSET', KEYS[1], 'expires_ms', tostring(tonumber(ARGV[2]) + ttl), 'load', ARGV[3],
           'version', ARGV[4], 'admitted', admitted, 'last_ms', ARGV[2])
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return {1, ttl, tonumber(admitted)}
)lua";

// KEYS[1] replica key, KEYS[2] index set. ARGV: lease, id. Returns 1 if removed.
constexpr char kDeregisterScript[] = R"lua(
if redis.call('HGET', KEYS[1], 'lease') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[2])
return 1
)lua";

}  // namespace

absl::StatusOr<std::unique_ptr<RedisRegistry>> RedisRegistry::Connect(const std::string& host, int port,
                                                                      common::Clock* clock, absl::Duration timeout,
                                                                      std::string key_prefix, RegistryLimits limits) {
  ASSIGN_OR_RETURN(auto client, redis::Client::Connect(host, port, timeout));
  // Heartbeats name the script by its SHA1 (EVALSHA) instead of sending its text for
  // Redis to hash on every call.
  ASSIGN_OR_RETURN(Reply sha, client->Command({"SCRIPT", "LOAD", kHeartbeatScript}));
  return std::unique_ptr<RedisRegistry>(
      new RedisRegistry(std::move(client), clock, std::move(key_prefix), std::move(sha.str), limits));
}

RedisRegistry::RedisRegistry(std::unique_ptr<redis::Client> client, common::Clock* clock, std::string key_prefix,
                             std::string heartbeat_sha, RegistryLimits limits)
    : client_(std::move(client)),
      clock_(clock),
      limits_(limits),
      prefix_(std::move(key_prefix)),
      heartbeat_sha_(std::move(heartbeat_sha)) {}

RedisRegistry::~RedisRegistry() = default;

std::string RedisRegistry::Key(absl::string_view replica_id) const {
  return absl::StrCat(prefix_, "replica:", replica_id);
}

absl::StatusOr<Lease> RedisRegistry::Register(const v1::ReplicaInfo& replica, absl::Duration ttl) {
  if (ttl == absl::ZeroDuration()) ttl = kDefaultTtl;
  RETURN_IF_ERROR(ValidateRegistration(replica, ttl));
  const int64_t now = absl::ToUnixMillis(clock_->Now());
  const int64_t ttl_ms = absl::ToInt64Milliseconds(ttl);
  v1::ReplicaInfo stored = replica;
  const bool admitted = IsAdmitted(replica.role(), replica.policy_version());
  stored.set_admitted(admitted);
  stored.set_last_heartbeat_unix_ms(now);
  Lease lease{common::NewId("lease"), ttl, stored};
  v1::ReplicaInfo info = stored;  // load and version live in their own fields
  info.clear_load();
  info.clear_policy_version();
  const std::string role = absl::StrCat(static_cast<int>(replica.role()));
  ASSIGN_OR_RETURN(
      Reply reply,
      client_->Command({"EVAL", kRegisterScript, "3", Key(replica.replica_id()), prefix_ + "replicas",
                        absl::StrCat(prefix_, "replicas:role:", role), replica.replica_id(), info.SerializeAsString(),
                        lease.lease_id, absl::StrCat(ttl_ms), absl::StrCat(now + ttl_ms), admitted ? "1" : "0",
                        replica.load().SerializeAsString(), replica.policy_version().SerializeAsString(),
                        absl::StrCat(now), replica.grpc_address(), role, absl::StrCat(limits_.max_live_per_role),
                        Key("")}));
  if (reply.type != Reply::Type::kArray || reply.elements.empty()) {
    return absl::InternalError("registry: unexpected reply to the register script");
  }
  switch (reply.elements[0].integer) {
    case 1:
      return lease;
    case 0:
      return IdHeldError(replica.replica_id(), reply.elements.size() > 1 ? reply.elements[1].str : "",
                         replica.grpc_address());
    default:
      return RoleFullError(replica.role(), limits_.max_live_per_role);
  }
}

absl::StatusOr<HeartbeatResult> RedisRegistry::Heartbeat(absl::string_view replica_id, absl::string_view lease_id,
                                                         const v1::LoadStats& load, const v1::PolicyVersion& version) {
  // (the client's timeout bounds the wait)
  return common::AwaitCallback<absl::StatusOr<HeartbeatResult>>(
      [&](auto done) { HeartbeatAsync(replica_id, lease_id, load, version, std::move(done)); });
}

void RedisRegistry::HeartbeatAsync(absl::string_view replica_id, absl::string_view lease_id, const v1::LoadStats& load,
                                   const v1::PolicyVersion& version, HeartbeatDone done) {
  for (const auto& [field, id] : {std::pair{"replica_id", replica_id}, std::pair{"lease_id", lease_id}}) {
    if (absl::Status s = common::ValidateId(field, id); !s.ok()) return done(s);
  }
  if (absl::Status s = ValidateLoad(load, "load"); !s.ok()) return done(s);
  if (absl::Status s = ValidateVersion(version, "policy_version"); !s.ok()) return done(s);
  const int64_t now = absl::ToUnixMillis(clock_->Now());
  // Admission depends on the role, which the script does not know: rollout replicas
  // need a version > 0, others were admitted at registration already.
  const bool admitted_now = version.version() > 0;
  // Thousands of replicas heartbeat one controller: the heartbeats queued while one
  // pipeline is at Redis share the next round trip, and no caller's thread waits.
  std::vector<std::string> args = {Key(replica_id),          std::string(lease_id),       absl::StrCat(now),
                                   load.SerializeAsString(), version.SerializeAsString(), admitted_now ? "1" : "0"};
  std::vector<std::string> argv = {"EVALSHA", heartbeat_sha_, "1"};
  argv.insert(argv.end(), args.begin(), args.end());
  client_->CommandAsync(
      std::move(argv), [this, args = std::move(args), done = std::move(done), replica = std::string(replica_id),
                        lease = std::string(lease_id)](absl::StatusOr<Reply> reply) mutable {
        if (!reply.ok() && absl::StrContains(reply.status().message(), "NOSCRIPT")) {
          // Redis restarted or its scripts were flushed: send the text (Redis caches it
          // again under the same SHA1).
          std::vector<std::string> with_text = {"EVAL", kHeartbeatScript, "1"};
          with_text.insert(with_text.end(), args.begin(), args.end());
          client_->CommandAsync(std::move(with_text),
                                [done = std::move(done), replica, lease](absl::StatusOr<Reply> again) {
                                  HeartbeatDoneWith(std::move(again), replica, lease, done);
                                });
          return;
        }
        HeartbeatDoneWith(std::move(reply), replica, lease, done);
      });
}

void RedisRegistry::HeartbeatDoneWith(absl::StatusOr<Reply> reply, const std::string& replica, const std::string& lease,
                                      const HeartbeatDone& done) {
  if (!reply.ok()) return done(reply.status());
  if (reply->type != Reply::Type::kArray || reply->elements.size() < 3 || reply->elements[0].integer == 0) {
    return done(absl::NotFoundError(
        absl::StrCat("no live lease ", lease, " for replica ", replica, " (expired?): register again")));
  }
  HeartbeatResult result;
  result.ttl = absl::Milliseconds(reply->elements[1].integer);
  result.admitted = reply->elements[2].integer != 0;
  done(result);
}

absl::StatusOr<bool> RedisRegistry::Deregister(absl::string_view replica_id, absl::string_view lease_id) {
  RETURN_IF_ERROR(common::ValidateId("replica_id", replica_id));
  RETURN_IF_ERROR(common::ValidateId("lease_id", lease_id));
  ASSIGN_OR_RETURN(Reply reply, client_->Command({"EVAL", kDeregisterScript, "2", Key(replica_id), prefix_ + "replicas",
                                                  std::string(lease_id), std::string(replica_id)}));
  return reply.type == Reply::Type::kInteger && reply.integer == 1;
}

absl::StatusOr<std::vector<v1::ReplicaInfo>> RedisRegistry::List(v1::ReplicaRole role, bool only_admitted) {
  const int64_t now = absl::ToUnixMillis(clock_->Now());
  ASSIGN_OR_RETURN(Reply ids, client_->Command({"SMEMBERS", prefix_ + "replicas"}));
  std::vector<std::string> members;
  for (const Reply& id : ids.elements) members.push_back(id.str);
  std::sort(members.begin(), members.end());
  std::vector<std::vector<std::string>> reads;
  for (const std::string& id : members) {
    reads.push_back({"HMGET", Key(id), "info", "load", "version", "admitted", "expires_ms", "last_ms"});
  }
  ASSIGN_OR_RETURN(std::vector<Reply> records, client_->Pipeline(reads));
  std::vector<v1::ReplicaInfo> out;
  for (size_t k = 0; k < members.size(); ++k) {
    const std::string& id = members[k];
    const Reply& h = records[k];
    if (h.type != Reply::Type::kArray || h.elements.size() != 6 || h.elements[0].is_nil()) {
      (void)client_->Command({"SREM", prefix_ + "replicas", id});  // collected by Redis
      continue;
    }
    auto field = [&](int i) { return h.elements[i].str; };
    int64_t expires = 0;
    if (!absl::SimpleAtoi(field(4), &expires) || expires <= now) continue;  // lease expired
    v1::ReplicaInfo info;
    if (!info.ParseFromString(field(0)) || !info.mutable_load()->ParseFromString(field(1)) ||
        !info.mutable_policy_version()->ParseFromString(field(2))) {
      return absl::DataLossError(absl::StrCat("registry record of ", id, " is corrupt"));
    }
    info.set_admitted(field(3) == "1");
    int64_t last = 0;
    if (absl::SimpleAtoi(field(5), &last)) info.set_last_heartbeat_unix_ms(last);
    if (role != v1::REPLICA_ROLE_UNSPECIFIED && info.role() != role) continue;
    if (only_admitted && !info.admitted()) continue;
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace rlfleet::registry

#include "libs/registry/redis/redis_registry.h"

#include <hiredis/hiredis.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"

namespace rlfleet::registry {
namespace {

using Reply = std::unique_ptr<redisReply, void (*)(void*)>;

// KEYS[1] replica key, KEYS[2] index set. ARGV: id, info, lease, ttl_ms, expires_ms,
// admitted, load, version, now_ms.
constexpr char kRegisterScript[] = R"lua(
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'info', ARGV[2], 'lease', ARGV[3], 'ttl_ms', ARGV[4],
           'expires_ms', ARGV[5], 'admitted', ARGV[6], 'load', ARGV[7], 'version', ARGV[8],
           'last_ms', ARGV[9])
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[4]))
redis.call('SADD', KEYS[2], ARGV[1])
return 1
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

absl::Status ReplyError(const redisReply* reply, absl::string_view what) {
  if (reply == nullptr) return absl::UnavailableError(absl::StrCat(what, ": no reply from Redis"));
  if (reply->type == REDIS_REPLY_ERROR) {
    return absl::InternalError(absl::StrCat(what, ": Redis error: ", std::string(reply->str, reply->len)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisRegistry>> RedisRegistry::Connect(
    const std::string& host, int port, common::Clock* clock, absl::Duration timeout,
    std::string key_prefix) {
  std::unique_ptr<RedisRegistry> registry(
      new RedisRegistry(host, port, clock, timeout, std::move(key_prefix)));
  absl::MutexLock lock(&registry->mu_);
  RETURN_IF_ERROR(registry->EnsureConnected());
  ASSIGN_OR_RETURN(Reply pong, registry->Command({"PING"}));
  RETURN_IF_ERROR(ReplyError(pong.get(), "PING"));
  return registry;
}

RedisRegistry::RedisRegistry(std::string host, int port, common::Clock* clock,
                             absl::Duration timeout, std::string key_prefix)
    : host_(std::move(host)), port_(port), clock_(clock), timeout_(timeout),
      prefix_(std::move(key_prefix)) {}

RedisRegistry::~RedisRegistry() {
  absl::MutexLock lock(&mu_);
  if (context_ != nullptr) redisFree(context_);
}

std::string RedisRegistry::Key(absl::string_view replica_id) const {
  return absl::StrCat(prefix_, "replica:", replica_id);
}

absl::Status RedisRegistry::EnsureConnected() {
  if (context_ != nullptr && context_->err == 0) return absl::OkStatus();
  if (context_ != nullptr) redisFree(context_);
  const timeval tv = absl::ToTimeval(timeout_);
  context_ = redisConnectWithTimeout(host_.c_str(), port_, tv);
  if (context_ == nullptr || context_->err != 0) {
    const std::string why = context_ != nullptr ? context_->errstr : "out of memory";
    if (context_ != nullptr) redisFree(context_);
    context_ = nullptr;
    return absl::UnavailableError(absl::StrCat("cannot reach Redis at ", host_, ":", port_, ": ", why));
  }
  redisSetTimeout(context_, tv);
  return absl::OkStatus();
}

absl::StatusOr<Reply> RedisRegistry::Command(const std::vector<std::string>& argv) {
  std::vector<const char*> args;
  std::vector<size_t> lengths;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lengths.push_back(a.size());
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    RETURN_IF_ERROR(EnsureConnected());
    void* raw = redisCommandArgv(context_, static_cast<int>(args.size()), args.data(), lengths.data());
    if (raw != nullptr) return Reply(static_cast<redisReply*>(raw), freeReplyObject);
    // The connection broke (e.g. Redis restarted): dial again once.
    redisFree(context_);
    context_ = nullptr;
  }
  return absl::UnavailableError(absl::StrCat("Redis at ", host_, ":", port_, " did not answer `",
                                             argv[0], "`"));
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
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Reply reply,
                   Command({"EVAL", kRegisterScript, "2", Key(replica.replica_id()),
                            prefix_ + "replicas", replica.replica_id(), info.SerializeAsString(),
                            lease.lease_id, absl::StrCat(ttl_ms), absl::StrCat(now + ttl_ms),
                            admitted ? "1" : "0", replica.load().SerializeAsString(),
                            replica.policy_version().SerializeAsString(), absl::StrCat(now)}));
  RETURN_IF_ERROR(ReplyError(reply.get(), "Register"));
  return lease;
}

absl::StatusOr<HeartbeatResult> RedisRegistry::Heartbeat(absl::string_view replica_id,
                                                         absl::string_view lease_id,
                                                         const v1::LoadStats& load,
                                                         const v1::PolicyVersion& version) {
  RETURN_IF_ERROR(common::ValidateId("replica_id", replica_id));
  RETURN_IF_ERROR(common::ValidateId("lease_id", lease_id));
  const int64_t now = absl::ToUnixMillis(clock_->Now());
  // Admission depends on the role, which the script does not know: rollout replicas
  // need a version > 0, others were admitted at registration already.
  const bool admitted_now = version.version() > 0;
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Reply reply,
                   Command({"EVAL", kHeartbeatScript, "1", Key(replica_id), std::string(lease_id),
                            absl::StrCat(now), load.SerializeAsString(),
                            version.SerializeAsString(), admitted_now ? "1" : "0"}));
  RETURN_IF_ERROR(ReplyError(reply.get(), "Heartbeat"));
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 1 || reply->element[0]->integer == 0) {
    return absl::NotFoundError(absl::StrCat("no live lease ", lease_id, " for replica ",
                                            replica_id, " (expired?): register again"));
  }
  HeartbeatResult result;
  result.ttl = absl::Milliseconds(reply->element[1]->integer);
  result.admitted = reply->element[2]->integer != 0;
  return result;
}

absl::StatusOr<bool> RedisRegistry::Deregister(absl::string_view replica_id,
                                               absl::string_view lease_id) {
  RETURN_IF_ERROR(common::ValidateId("replica_id", replica_id));
  RETURN_IF_ERROR(common::ValidateId("lease_id", lease_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Reply reply, Command({"EVAL", kDeregisterScript, "2", Key(replica_id),
                                         prefix_ + "replicas", std::string(lease_id),
                                         std::string(replica_id)}));
  RETURN_IF_ERROR(ReplyError(reply.get(), "Deregister"));
  return reply->type == REDIS_REPLY_INTEGER && reply->integer == 1;
}

absl::StatusOr<std::vector<v1::ReplicaInfo>> RedisRegistry::List(v1::ReplicaRole role,
                                                                 bool only_admitted) {
  const int64_t now = absl::ToUnixMillis(clock_->Now());
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Reply ids, Command({"SMEMBERS", prefix_ + "replicas"}));
  RETURN_IF_ERROR(ReplyError(ids.get(), "List"));
  std::vector<std::string> members;
  for (size_t i = 0; i < ids->elements; ++i) {
    members.emplace_back(ids->element[i]->str, ids->element[i]->len);
  }
  std::sort(members.begin(), members.end());
  std::vector<v1::ReplicaInfo> out;
  for (const std::string& id : members) {
    ASSIGN_OR_RETURN(Reply h, Command({"HMGET", Key(id), "info", "load", "version", "admitted",
                                       "expires_ms", "last_ms"}));
    RETURN_IF_ERROR(ReplyError(h.get(), "List"));
    if (h->type != REDIS_REPLY_ARRAY || h->elements != 6 || h->element[0]->type != REDIS_REPLY_STRING) {
      (void)Command({"SREM", prefix_ + "replicas", id});  // collected by Redis: unindex it
      continue;
    }
    auto field = [&](int i) { return std::string(h->element[i]->str, h->element[i]->len); };
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

#include "services/controller/controller_core.h"

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"

namespace rlfleet::controller {
namespace {

constexpr char kPageTokenPrefix[] = "after:";

bool LabelsMatch(const v1::ReplicaInfo& replica, const google::protobuf::Map<std::string, std::string>& selector) {
  for (const auto& [key, value] : selector) {
    auto it = replica.labels().find(key);
    if (it == replica.labels().end() || it->second != value) return false;
  }
  return true;
}

}  // namespace

ControllerCore::ControllerCore(registry::Registry* registry, common::Clock* clock)
    : registry_(registry), clock_(clock), watch_(registry, clock) {}

absl::Status ControllerCore::Register(const v1::RegisterRequest& request, v1::RegisterResponse* response) {
  if (!request.has_replica()) return absl::InvalidArgumentError("replica is missing");
  if (request.ttl_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ttl_ms ", request.ttl_ms(), " is negative"));
  }
  ASSIGN_OR_RETURN(registry::Lease lease, registry_->Register(request.replica(), absl::Milliseconds(request.ttl_ms())));
  response->set_lease_id(lease.lease_id);
  response->set_ttl_ms(absl::ToInt64Milliseconds(lease.ttl));
  response->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(lease.ttl) / 3);
  *response->mutable_replica() = std::move(lease.replica);
  return absl::OkStatus();
}

absl::Status ControllerCore::Heartbeat(const v1::HeartbeatRequest& request, v1::HeartbeatResponse* response) {
  ASSIGN_OR_RETURN(registry::HeartbeatResult result, registry_->Heartbeat(request.replica_id(), request.lease_id(),
                                                                          request.load(), request.policy_version()));
  response->set_ttl_ms(absl::ToInt64Milliseconds(result.ttl));
  response->set_admitted(result.admitted);
  return absl::OkStatus();
}

void ControllerCore::HeartbeatAsync(const v1::HeartbeatRequest& request, v1::HeartbeatResponse* response,
                                    std::function<void(absl::Status)> done) {
  registry_->HeartbeatAsync(request.replica_id(), request.lease_id(), request.load(), request.policy_version(),
                            [response, done = std::move(done)](absl::StatusOr<registry::HeartbeatResult> result) {
                              if (!result.ok()) return done(result.status());
                              response->set_ttl_ms(absl::ToInt64Milliseconds(result->ttl));
                              response->set_admitted(result->admitted);
                              done(absl::OkStatus());
                            });
}

absl::Status ControllerCore::Deregister(const v1::DeregisterRequest& request, v1::DeregisterResponse* response) {
  ASSIGN_OR_RETURN(bool was_registered, registry_->Deregister(request.replica_id(), request.lease_id()));
  if (was_registered) watch_.NoteDeregistered(request.replica_id());
  response->set_was_registered(was_registered);
  return absl::OkStatus();
}

absl::Status ControllerCore::ListReplicas(const v1::ListReplicasRequest& request, v1::ListReplicasResponse* response) {
  if (!v1::ReplicaRole_IsValid(request.role())) {
    return absl::InvalidArgumentError(absl::StrCat("role ", request.role(), " is unknown"));
  }
  uint32_t page_size = request.page().page_size();
  if (page_size == 0) page_size = kDefaultPageSize;
  if (page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(absl::StrCat("page.page_size ", page_size, " exceeds ", kMaxPageSize));
  }
  absl::string_view after;
  if (!request.page().page_token().empty()) {
    after = request.page().page_token();
    if (!absl::ConsumePrefix(&after, kPageTokenPrefix)) {
      return absl::InvalidArgumentError("page.page_token is not one this server issued");
    }
  }
  ASSIGN_OR_RETURN(std::vector<v1::ReplicaInfo> replicas, registry_->List(request.role(), request.only_admitted()));
  for (v1::ReplicaInfo& replica : replicas) {  // ordered by id
    if (!after.empty() && replica.replica_id() <= after) continue;
    if (!LabelsMatch(replica, request.label_selector())) continue;
    if (static_cast<uint32_t>(response->replicas_size()) == page_size) {
      response->set_next_page_token(absl::StrCat(kPageTokenPrefix, response->replicas(page_size - 1).replica_id()));
      break;
    }
    *response->add_replicas() = std::move(replica);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<registry::Subscription>> ControllerCore::Watch(const v1::WatchReplicasRequest& request) {
  if (!v1::ReplicaRole_IsValid(request.role())) {
    return absl::InvalidArgumentError(absl::StrCat("role ", request.role(), " is unknown"));
  }
  // A fresh view first, so that the snapshot is current.
  RETURN_IF_ERROR(watch_.Poll());
  return watch_.Subscribe(request.role(), request.send_snapshot());
}

void ControllerCore::StartWatching(absl::Duration interval) { watch_.Start(interval); }

absl::Status ControllerCore::GetStatus(const v1::GetStatusRequest& /*request*/, v1::GetStatusResponse* response) {
  response->set_state(v1::RUN_STATE_IDLE);
  ASSIGN_OR_RETURN(std::vector<v1::ReplicaInfo> replicas, registry_->List(v1::REPLICA_ROLE_UNSPECIFIED, false));
  std::map<int, v1::RoleSummary> by_role;
  for (const v1::ReplicaInfo& replica : replicas) {
    v1::RoleSummary& summary = by_role[replica.role()];
    summary.set_role(replica.role());
    summary.set_registered(summary.registered() + 1);
    if (replica.admitted()) summary.set_admitted(summary.admitted() + 1);
    if (replica.policy_version().version() > response->policy_version().version()) {
      *response->mutable_policy_version() = replica.policy_version();
    }
  }
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [role, count] : desired_) {
      by_role[role].set_role(static_cast<v1::ReplicaRole>(role));
      by_role[role].set_desired(count);
    }
  }
  for (auto& [role, summary] : by_role) *response->add_replicas() = std::move(summary);
  return absl::OkStatus();
}

void ControllerCore::SetScaler(std::string scaler) {
  absl::MutexLock lock(&mu_);
  scaler_ = std::move(scaler);
}

absl::Status ControllerCore::Scale(const v1::ScaleRequest& request, v1::ScaleResponse* response) {
  switch (request.role()) {
    case v1::REPLICA_ROLE_ROLLOUT:
    case v1::REPLICA_ROLE_REWARD:
    case v1::REPLICA_ROLE_TRAINER:
    case v1::REPLICA_ROLE_WEIGHTS:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("role: ", v1::ReplicaRole_Name(request.role()),
                                                     " is not scaled (ROLLOUT, REWARD, TRAINER or WEIGHTS)"));
  }
  if (request.target_count() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("target_count ", request.target_count(), " is over 1024"));
  }
  ASSIGN_OR_RETURN(std::vector<v1::ReplicaInfo> replicas, registry_->List(request.role(), false));
  absl::MutexLock scaling(&scale_mu_);
  std::map<int, uint32_t> desired;
  {
    absl::MutexLock lock(&mu_);
    if (scaler_.empty()) {
      return absl::FailedPreconditionError(
          "no launcher or autoscaler acts on Scale here: start the fleet with deploy/local/launch.sh "
          "(or run the controller with --scaler)");
    }
    auto it = desired_.find(request.role());
    response->set_previous_count(it == desired_.end() ? replicas.size() : it->second);
    desired = desired_;
  }
  desired[request.role()] = request.target_count();
  // Saved before it is held: a count the caller was told is set survives a restart.
  if (desired_store_ != nullptr) {
    if (absl::Status s = desired_store_->SaveDesired(desired); !s.ok()) {
      return common::Annotate(s, "saving the desired counts (nothing changed)");
    }
  }
  {
    absl::MutexLock lock(&mu_);
    desired_ = std::move(desired);
  }
  response->set_target_count(request.target_count());
  response->set_registered(replicas.size());
  return absl::OkStatus();
}

absl::Status ControllerCore::UseDesiredStore(DesiredCountStore* store) {
  absl::MutexLock scaling(&scale_mu_);
  desired_store_ = store;
  if (store == nullptr) return absl::OkStatus();
  absl::StatusOr<std::map<int, uint32_t>> saved = store->LoadDesired();
  if (!saved.ok()) return saved.status();
  absl::MutexLock lock(&mu_);
  desired_ = std::move(*saved);
  return absl::OkStatus();
}

}  // namespace rlfleet::controller

#include "services/controller/discovery.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/common/status_macros.h"
#include "services/controller/reward_routes.h"

namespace rlfleet::controller {
namespace {

std::vector<v1::ReplicaInfo> Registered(ControllerCore& core, v1::ReplicaRole role) {
  v1::ListReplicasRequest request;
  request.set_role(role);
  request.mutable_page()->set_page_size(kMaxPageSize);
  v1::ListReplicasResponse response;
  if (!core.ListReplicas(request, &response).ok()) return {};
  return {response.replicas().begin(), response.replicas().end()};
}

}  // namespace

absl::StatusOr<std::string> ResolvePeerAddress(ControllerCore& core, v1::ReplicaRole role,
                                               const std::string& flag_value, absl::string_view flag_name) {
  if (!flag_value.empty()) return flag_value;
  const v1::ReplicaInfo* best = nullptr;
  uint64_t best_load = 0;
  const std::vector<v1::ReplicaInfo> replicas = Registered(core, role);
  for (const v1::ReplicaInfo& r : replicas) {
    if (ServesNamedTasksOnly(r)) continue;  // (a reward worker of some tasks only: RewardRoutes)
    const uint64_t load = uint64_t{r.load().inflight_requests()} + r.load().queued_requests();
    if (best == nullptr || load < best_load) {
      best = &r;
      best_load = load;
    }
  }
  if (best == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the controller knows no ", flag_name, " service: none registered (--registry_address) and no --", flag_name));
  }
  return best->grpc_address();
}

std::map<std::string, std::string> RewardRoutes(ControllerCore& core) {
  return RewardTaskRoutes(Registered(core, v1::REPLICA_ROLE_REWARD));
}

std::vector<std::string> RolloutAddressesForRun(ControllerCore& core, const std::string& flag_addresses) {
  std::set<std::string> addresses;
  for (absl::string_view a : absl::StrSplit(flag_addresses, ',', absl::SkipEmpty())) {
    addresses.insert(std::string(a));
  }
  for (const v1::ReplicaInfo& r : Registered(core, v1::REPLICA_ROLE_ROLLOUT)) addresses.insert(r.grpc_address());
  return {addresses.begin(), addresses.end()};
}

namespace {

absl::StatusOr<std::shared_ptr<registry::Subscription>> WatchRollouts(ControllerCore* core, bool snapshot) {
  v1::WatchReplicasRequest watch;
  watch.set_role(v1::REPLICA_ROLE_ROLLOUT);
  watch.set_send_snapshot(snapshot);
  return core->Watch(watch);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RolloutDiscovery>> RolloutDiscovery::Start(ControllerCore* core, RunManager* runs,
                                                                          MakeReplica make, Log log,
                                                                          absl::Duration reconcile_every,
                                                                          absl::Duration retry_after) {
  ASSIGN_OR_RETURN(std::shared_ptr<registry::Subscription> sub, WatchRollouts(core, /*snapshot=*/false));
  return std::unique_ptr<RolloutDiscovery>(
      new RolloutDiscovery(core, sub, runs, std::move(make), std::move(log), reconcile_every, retry_after));
}

RolloutDiscovery::RolloutDiscovery(ControllerCore* core, std::shared_ptr<registry::Subscription> sub, RunManager* runs,
                                   MakeReplica make, Log log, absl::Duration reconcile_every,
                                   absl::Duration retry_after)
    : core_(core),
      sub_(std::move(sub)),
      runs_(runs),
      make_(std::move(make)),
      log_(std::move(log)),
      reconcile_every_(reconcile_every),
      retry_after_(retry_after) {
  thread_ = std::thread([this] { Loop(); });
}

RolloutDiscovery::~RolloutDiscovery() {
  stopping_ = true;
  {
    absl::MutexLock lock(&mu_);
    sub_->Close();
  }
  thread_.join();
}

absl::Status RolloutDiscovery::Offer(const std::string& address) {
  auto replica = make_(address);
  return replica.ok() ? runs_->AdmitRollout(std::move(*replica)) : replica.status();
}

void RolloutDiscovery::Reconcile() {
  if (!runs_->HasActiveRun()) {
    offered_.clear();
    return;
  }
  const std::vector<std::string> live = runs_->RolloutAddresses();
  const std::set<std::string> in_run(live.begin(), live.end());
  const absl::Time now = absl::Now();
  for (const v1::ReplicaInfo& r : Registered(*core_, v1::REPLICA_ROLE_ROLLOUT)) {
    const std::string& address = r.grpc_address();
    if (in_run.count(address) > 0) continue;
    auto [it, fresh] = offered_.try_emplace(address, now);
    if (!fresh && now - it->second < retry_after_) continue;
    it->second = now;
    const absl::Status s = Offer(address);
    if (absl::IsAlreadyExists(s)) continue;
    if (log_) {
      log_(absl::StrCat("discovery: registered rollout replica ", address,
                        " was not in the run: ", s.ok() ? "admitted" : s.ToString()));
    }
  }
}

void RolloutDiscovery::Loop() {
  absl::Time last_reconcile = absl::Now();
  while (!stopping_) {
    if (absl::Now() - last_reconcile >= reconcile_every_) {
      last_reconcile = absl::Now();
      Reconcile();
    }
    std::shared_ptr<registry::Subscription> sub;
    {
      absl::MutexLock lock(&mu_);
      sub = sub_;
    }
    std::optional<v1::ReplicaEvent> event = sub->Next(absl::Milliseconds(500));
    if (!event && sub->closed() && !stopping_) {
      // The registry closed a watch that fell too far behind: watch again, from a
      // snapshot of who is registered now (an ADDED event for each).
      if (log_) log_("discovery: the registry watch was closed; watching again");
      auto again = WatchRollouts(core_, /*snapshot=*/true);
      absl::MutexLock lock(&mu_);
      if (!again.ok() || stopping_) return;
      sub_ = *again;
      continue;
    }
    if (!event) continue;
    const std::string& address = event->replica().grpc_address();
    absl::Status s;
    if (event->type() == v1::REPLICA_EVENT_TYPE_ADDED) {
      // No active run: nothing to do (a run lists the registry when it starts). Any
      // other refusal (e.g. FAILED_PRECONDITION: the replica serves another run's
      // version) is logged, not taken for "no run".
      if (!runs_->HasActiveRun()) continue;
      s = Offer(address);
      if (absl::IsAlreadyExists(s)) s = absl::OkStatus();  // (already in the pool)
    } else if (event->type() == v1::REPLICA_EVENT_TYPE_REMOVED || event->type() == v1::REPLICA_EVENT_TYPE_EXPIRED) {
      s = runs_->RemoveRollout(address);
      // No active run, or not in its pool: nothing to do.
      if (absl::IsFailedPrecondition(s) || absl::IsNotFound(s)) s = absl::OkStatus();
    }
    if (!s.ok() && log_) log_(absl::StrCat("discovery: rollout replica ", address, ": ", s.ToString()));
  }
}

}  // namespace rlfleet::controller

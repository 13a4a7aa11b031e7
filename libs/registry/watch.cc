#include "libs/registry/watch.h"

#include "absl/time/clock.h"

namespace rlfleet::registry {

std::optional<v1::ReplicaEvent> Subscription::Next(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return closed_ || !queue_.empty(); };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (queue_.empty()) return std::nullopt;
  v1::ReplicaEvent event = std::move(queue_.front());
  queue_.pop_front();
  return event;
}

void Subscription::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

bool Subscription::closed() {
  absl::MutexLock lock(&mu_);
  return closed_;
}

void Subscription::Push(const v1::ReplicaEvent& event) {
  if (role_ != v1::REPLICA_ROLE_UNSPECIFIED && event.replica().role() != role_) return;
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  if (queue_.size() >= kMaxQueued) {
    closed_ = true;  // too far behind: the watcher re-watches with a snapshot
    queue_.clear();
    return;
  }
  queue_.push_back(event);
}

RegistryWatch::~RegistryWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& weak : subscribers_) {
    if (auto sub = weak.lock()) sub->Close();
  }
}

void RegistryWatch::Start(absl::Duration interval) {
  thread_ = std::thread([this, interval] {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stop_), interval)) return;
      }
      Poll().IgnoreError();  // a store that is down: the next poll tries again
    }
  });
}

void RegistryWatch::NoteDeregistered(const std::string& replica_id) {
  absl::MutexLock lock(&mu_);
  deregistered_.insert(replica_id);
}

std::shared_ptr<Subscription> RegistryWatch::Subscribe(v1::ReplicaRole role, bool snapshot) {
  std::shared_ptr<Subscription> sub(new Subscription(role));
  absl::MutexLock lock(&mu_);
  if (snapshot) {
    for (const auto& [id, replica] : known_) {
      v1::ReplicaEvent event;
      event.set_type(v1::REPLICA_EVENT_TYPE_ADDED);
      *event.mutable_replica() = replica;
      event.set_revision(revision_);
      event.set_event_unix_ms(absl::ToUnixMillis(clock_->Now()));
      sub->Push(event);
    }
  }
  subscribers_.push_back(sub);
  return sub;
}

void RegistryWatch::Deliver(const v1::ReplicaEvent& event) {
  for (auto it = subscribers_.begin(); it != subscribers_.end();) {
    auto sub = it->lock();
    if (sub == nullptr || sub->closed()) {
      it = subscribers_.erase(it);
      continue;
    }
    sub->Push(event);
    ++it;
  }
}

absl::Status RegistryWatch::Poll() {
  absl::MutexLock poll_lock(&poll_mu_);
  absl::StatusOr<std::vector<v1::ReplicaInfo>> listed = registry_->List(v1::REPLICA_ROLE_UNSPECIFIED, false);
  if (!listed.ok()) return listed.status();
  absl::MutexLock lock(&mu_);
  const int64_t now_ms = absl::ToUnixMillis(clock_->Now());
  auto emit = [&](v1::ReplicaEventType type, const v1::ReplicaInfo& replica) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::ReplicaEvent event;
    event.set_type(type);
    *event.mutable_replica() = replica;
    event.set_revision(++revision_);
    event.set_event_unix_ms(now_ms);
    Deliver(event);
  };
  std::map<std::string, v1::ReplicaInfo> now;
  for (v1::ReplicaInfo& r : *listed) now.emplace(r.replica_id(), std::move(r));
  for (const auto& [id, replica] : now) {
    auto old = known_.find(id);
    if (old == known_.end()) {
      emit(v1::REPLICA_EVENT_TYPE_ADDED, replica);
      if (replica.admitted()) emit(v1::REPLICA_EVENT_TYPE_ADMITTED, replica);
      continue;
    }
    if (replica.admitted() && !old->second.admitted()) {
      emit(v1::REPLICA_EVENT_TYPE_ADMITTED, replica);
    } else if (replica.policy_version().version() != old->second.policy_version().version() ||
               replica.load().SerializeAsString() != old->second.load().SerializeAsString()) {
      emit(v1::REPLICA_EVENT_TYPE_UPDATED, replica);
    }
  }
  for (const auto& [id, replica] : known_) {
    if (now.count(id)) continue;
    const bool asked = deregistered_.erase(id) > 0;
    emit(asked ? v1::REPLICA_EVENT_TYPE_REMOVED : v1::REPLICA_EVENT_TYPE_EXPIRED, replica);
  }
  known_ = std::move(now);
  return absl::OkStatus();
}

}  // namespace rlfleet::registry

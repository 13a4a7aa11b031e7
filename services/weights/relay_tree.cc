#include "services/weights/relay_tree.h"

#include <iterator>
#include <utility>

namespace rlfleet::weights {

std::optional<RelayTree::Sender> RelayTree::Begin(uint64_t version, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  Version& v = versions_[version];
  // -1: this service; an index: that holder; nullopt: nobody has room yet.
  auto pick = [&](bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::optional<int> {
    if (v.root_children < fanout_) return -1;
    for (size_t i = 0; i < v.holders.size(); ++i) {
      const Holder& h = v.holders[i];
      if (!h.failed && h.children < fanout_) return static_cast<int>(i);
    }
    // Nobody has room: wait for a pull under way to end (it may add a holder), or fall
    // back to this service when none is.
    if (wait && v.in_flight > 0) return std::nullopt;
    return -1;
  };
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pick(true).has_value(); };
  ++v.waiting;  // (ForgetBefore keeps it meanwhile)
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  --v.waiting;
  const int chosen = pick(false).value_or(-1);
  ++v.in_flight;
  if (chosen < 0) {
    ++v.root_children;
    return std::nullopt;
  }
  ++v.holders[chosen].children;
  return v.holders[chosen].sender;
}

void RelayTree::BeginFromHere(uint64_t version) {
  absl::MutexLock lock(&mu_);
  ++versions_[version].in_flight;
}

void RelayTree::End(uint64_t version, std::optional<Sender> holder) {
  absl::MutexLock lock(&mu_);
  Version& v = versions_[version];
  --v.in_flight;
  if (holder) v.holders.push_back({std::move(*holder)});
}

void RelayTree::Failed(uint64_t version, const std::string& replica_id) {
  absl::MutexLock lock(&mu_);
  auto v = versions_.find(version);
  if (v == versions_.end()) return;
  for (Holder& h : v->second.holders) h.failed |= h.sender.replica_id == replica_id;
}

void RelayTree::Gone(const std::string& replica_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [number, v] : versions_) {
    for (Holder& h : v.holders) h.failed |= h.sender.replica_id == replica_id;
  }
}

void RelayTree::ForgetBefore(uint64_t oldest) {
  absl::MutexLock lock(&mu_);
  // (a version with pulls under way or waiting stays until they end)
  for (auto it = versions_.begin(); it != versions_.end() && it->first < oldest;) {
    it = it->second.in_flight > 0 || it->second.waiting > 0 ? std::next(it) : versions_.erase(it);
  }
}

}  // namespace rlfleet::weights

// Watching the registry: successive List() snapshots turned into change events, so it
// works the same for every backend and sees lease expiry (a replica that vanished
// without a Deregister through this watch is EXPIRED, otherwise REMOVED).
//
//   RegistryWatch watch(registry, clock);
//   auto sub = watch.Subscribe(v1::REPLICA_ROLE_ROLLOUT, /*snapshot=*/true);
//   watch.Poll();                       // or Start(interval) for a polling thread
//   while (auto event = sub->Next(absl::Seconds(1))) ...
//
// Thread-safe.
#ifndef RLFLEET_LIBS_REGISTRY_WATCH_H_
#define RLFLEET_LIBS_REGISTRY_WATCH_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "libs/registry/registry.h"
#include "rlfleet/v1/controller.pb.h"

namespace rlfleet::registry {

// One watcher's queue of events. Bounded: a watcher that falls more than kMaxQueued
// events behind is closed (it must re-watch with a snapshot), never blocks the others.
class Subscription {
 public:
  static constexpr size_t kMaxQueued = 10000;
  // The next event, or nullopt after `timeout` or once closed (see closed()).
  std::optional<v1::ReplicaEvent> Next(absl::Duration timeout);
  void Close();
  bool closed();

 private:
  friend class RegistryWatch;
  Subscription(v1::ReplicaRole role) : role_(role) {}
  void Push(const v1::ReplicaEvent& event);

  const v1::ReplicaRole role_;
  absl::Mutex mu_;
  std::deque<v1::ReplicaEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class RegistryWatch {
 public:
  // `registry` and `clock` are not owned.
  RegistryWatch(Registry* registry, common::Clock* clock) : registry_(registry), clock_(clock) {}
  ~RegistryWatch();

  // Polls every `interval` on a thread of its own until destruction.
  void Start(absl::Duration interval);
  // One poll now: lists the registry and delivers the changes since the last poll.
  absl::Status Poll();
  // Records that `replica_id` was deregistered on request (its disappearance is REMOVED).
  void NoteDeregistered(const std::string& replica_id);
  // Events for `role` (UNSPECIFIED = all) from now on; with `snapshot`, first an ADDED
  // event per replica known at the last poll.
  std::shared_ptr<Subscription> Subscribe(v1::ReplicaRole role, bool snapshot);

 private:
  void Deliver(const v1::ReplicaEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Registry* const registry_;
  common::Clock* const clock_;
  absl::Mutex poll_mu_;  // one poll at a time, so snapshots apply in order
  absl::Mutex mu_;
  std::map<std::string, v1::ReplicaInfo> known_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> deregistered_ ABSL_GUARDED_BY(mu_);
  uint64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::weak_ptr<Subscription>> subscribers_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rlfleet::registry

#endif  // RLFLEET_LIBS_REGISTRY_WATCH_H_

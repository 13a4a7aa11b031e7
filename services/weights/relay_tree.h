// RelayTree: who sends a version to whom when replicas pull it (the weights service's
// relay fan-out). This service sends a version to at most `fanout` replicas itself;
// every replica that has it and may relay serves it to at most `fanout` more (a chain
// for 1), so no link carries a version more than `fanout` times however many replicas
// sync. A pull that finds no sender with room waits for one (bounded by its deadline)
// while other pulls of the version are under way, since each may add a sender. No I/O;
// its own lock; thread-safe.
#ifndef RLFLEET_SERVICES_WEIGHTS_RELAY_TREE_H_
#define RLFLEET_SERVICES_WEIGHTS_RELAY_TREE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rlfleet/v1/rollout.pb.h"

namespace rlfleet::weights {

class RelayTree {
 public:
  // `fanout` 0: no relaying (every pull is from this service).
  explicit RelayTree(int fanout) : fanout_(fanout) {}

  int fanout() const { return fanout_; }

  // A replica serving a version to others.
  struct Sender {
    std::string replica_id;
    v1::TransferDescriptor source;  // its copy
  };

  // Starts one pull of `version`: the sender with room (a replica holding it), or
  // nullopt for this service; the slot is taken and the pull counted under way until
  // End. When neither this service nor any holder has room, waits until `deadline`
  // for a pull under way to end, then falls back to this service.
  std::optional<Sender> Begin(uint64_t version, absl::Time deadline);
  // Starts a pull from this service without taking a slot (a retry after a failed relay).
  void BeginFromHere(uint64_t version);
  // Ends a pull started by Begin or BeginFromHere. `holder`: the replica now holds the
  // version and serves it to others.
  void End(uint64_t version, std::optional<Sender> holder);
  // `replica_id` serves nothing of `version` any more (its relay failed).
  void Failed(uint64_t version, const std::string& replica_id);
  // `replica_id` serves nothing any more (unregistered).
  void Gone(const std::string& replica_id);
  // Forgets the versions before `oldest`.
  void ForgetBefore(uint64_t oldest);

 private:
  struct Holder {
    Sender sender;
    int children = 0;
    bool failed = false;
  };
  struct Version {
    std::vector<Holder> holders;  // in the order they got it
    int root_children = 0;        // replicas this service sent it to itself
    int in_flight = 0;            // pulls under way
    int waiting = 0;              // pulls in Begin waiting for a sender
  };

  const int fanout_;
  absl::Mutex mu_;
  std::map<uint64_t, Version> versions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlfleet::weights

#endif  // RLFLEET_SERVICES_WEIGHTS_RELAY_TREE_H_

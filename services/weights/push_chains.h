// PushChains: the weights service's push path. A version is repacked once in the
// planner's layout (one source rank holding every tensor whole, registered on the data
// plane) and pushed through libs/reshard's executor along a chain of replicas: this
// service is the source rank, each replica a destination rank that passes every chunk
// on to the next as it arrives. A replica the push misses (no data plane, a relay that
// died, a stall) is handed back to pull the version instead. Its own lock (the push
// copy, the executor's staging); thread-safe.
#ifndef RLFLEET_SERVICES_WEIGHTS_PUSH_CHAINS_H_
#define RLFLEET_SERVICES_WEIGHTS_PUSH_CHAINS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/host_buffer.h"
#include "libs/reshard/executor.h"
#include "libs/reshard/plan.h"
#include "libs/transport/transport.h"
#include "services/weights/destination.h"
#include "services/weights/version_store.h"

namespace rlfleet::weights {

class PushChains {
 public:
  // `data_plane` (not owned) carries the rounds; each round waits at most
  // `round_timeout` for a peer (a stalled or dead relay costs that much before the
  // replicas after it pull instead).
  PushChains(transport::Transport* data_plane, absl::Duration round_timeout);
  ~PushChains();

  using Logger = std::function<void(const std::string& line)>;
  void SetLogger(Logger logger) { logger_ = std::move(logger); }  // (called without a lock)
  // Faults in `bytes` now for the next push copy.
  void PrefaultMemory(uint64_t bytes);

  // The chains for the replicas `ids` (id, may relay): the ones that may relay spread
  // over `fanout` chains (0: each its own); one that may not relay ends a chain, or is a
  // chain of its own.
  static std::vector<std::vector<std::string>> ChainsOf(const std::vector<std::pair<std::string, bool>>& ids,
                                                        int fanout);

  struct Member {
    std::string replica_id;
    std::shared_ptr<Destination> destination;  // null: not registered (it pulls, and hears so)
  };
  // What a push tells its caller about each replica, as it happens.
  class Observer {
   public:
    virtual ~Observer() = default;
    virtual void AlreadyInstalled(const std::string& replica_id) = 0;
    virtual void Transferring(const std::string& replica_id, uint64_t bytes_needed) = 0;
    // `from`: the replica that relayed it, empty for this service.
    virtual void Installed(const std::string& replica_id, const std::string& from,
                           const v1::CommitWeightsResponse& installed, absl::Duration took) = 0;
    virtual void Failed(const std::string& replica_id, const absl::Status& why) = 0;
  };
  // Pushes `version` along `chain` in one round (a replica already at the version is
  // left out as installed). Returns the replicas it did not install on, to pull instead.
  std::vector<std::string> Push(const Lease& version, const std::vector<Member>& chain, absl::Time deadline,
                                Observer& observer);

 private:
  // A version repacked for pushing; shared with the rounds using it. Its memory goes to
  // the pool when the last round lets go.
  struct Source {
    ~Source();
    transport::Transport* data_plane = nullptr;
    uint64_t version = 0;
    common::HostBuffer packed;  // (back to the pool after the deregistration)
    transport::MemoryHandle handle;
    reshard::Plan plan;  // to one destination rank holding every tensor whole
    uint64_t share = 0;  // this source's share of that rank's digest
  };
  absl::StatusOr<std::shared_ptr<Source>> SourceLocked(const Lease& version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Log(const std::string& line) const {
    if (logger_) logger_(line);
  }

  transport::Transport* const data_plane_;
  const absl::Duration round_timeout_;
  const std::shared_ptr<common::BufferPool> pool_;  // a retired push copy's memory
  Logger logger_;
  absl::Mutex mu_;
  std::shared_ptr<Source> cached_ ABSL_GUARDED_BY(mu_);  // the last version's push copy
  uint32_t next_epoch_ ABSL_GUARDED_BY(mu_) = 0;         // the next round's tag epoch (mod 16)
  // The executor's staging and mappings, one per round in flight.
  std::vector<std::unique_ptr<reshard::StagingPool>> staging_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlfleet::weights

#endif  // RLFLEET_SERVICES_WEIGHTS_PUSH_CHAINS_H_

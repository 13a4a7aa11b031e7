// WeightsCore: the weight-broadcast service's logic without gRPC. PublishVersion takes
// a version the trainer wrote (its safetensors image by FILE or memory descriptor, or
// one descriptor per rank and tensor from a sharded trainer), reads it and checks the
// digests before anything sees it, and keeps it in memory on the data
// plane; SyncVersion / SyncAll have registered rollout replicas pull and install it
// (RolloutService.UpdateWeights through a Destination), each under its own deadline, so
// a replica that dies or stalls is dropped from the round (FAILED, with the reason)
// while the others finish. With a relay fan-out, replicas that have a version serve it
// to the next ones (a chain or tree), so this service's link carries each version at
// most fan-out times. GetSyncStatus reports each destination's phase, bytes, timings
// and whom it got the version from.
//
// Push (EnablePush): where a replica has a data plane (GetInfo's data_plane), a sync
// pushes the version through libs/reshard's executor instead: this service is the
// source rank of a plan into the replica's layout, the replica its destination rank
// (each rank only its layout's bytes), and SyncAll chains the replicas (--relay_fanout
// chains) so that each passes every chunk on to the next as it arrives. A replica the
// push misses (no data plane, a relay that died, a stall) pulls the version instead,
// within the same deadline.
//
// This class is the facade: the registered destinations are its own; the versions
// (VersionStore), who relays to whom (RelayTree) and the push rounds (PushChains) are
// each a part with its own lock and tests. Thread-safe.
#ifndef RLFLEET_SERVICES_WEIGHTS_WEIGHTS_CORE_H_
#define RLFLEET_SERVICES_WEIGHTS_WEIGHTS_CORE_H_

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/transport/transport.h"
#include "rlfleet/v1/rollout.pb.h"
#include "rlfleet/v1/weights.pb.h"
#include "services/weights/destination.h"
#include "services/weights/push_chains.h"
#include "services/weights/relay_tree.h"
#include "services/weights/version_store.h"

namespace rlfleet::weights {

class WeightsCore {
 public:
  // With a `data_plane` (not owned), each published version is kept in memory
  // registered with it and replicas pull it from there (a UCX descriptor: no shared
  // filesystem between this service and the replicas); without one they get the
  // trainer's FILE descriptor. The records (status) of the latest 8 versions are kept,
  // the bytes of the newest SetKeepVersions (default 2: a replica may still be syncing
  // the one before), so that each version pulled reuses an older one's memory.
  //
  // Relay tree (`relay_fanout` > 0, with a data plane): this service sends a version to
  // at most `relay_fanout` replicas itself; every replica that has it serves it to at
  // most `relay_fanout` more (chain for 1), so no link carries a version more than
  // `relay_fanout` times however many replicas sync. A sync that finds no sender with
  // room waits for one (bounded by its timeout) while others are in flight; one whose
  // relay fails (the relaying replica died or moved on) is sent again from here.
  explicit WeightsCore(DestinationFactory factory, transport::Transport* data_plane = nullptr, int relay_fanout = 0);
  ~WeightsCore();

  // One line per published version and per sync (who, from where, bytes, phase times,
  // GB/s, or why it failed). It may be called with one of the core's locks held: it
  // must not call into the core. Set before serving.
  using Logger = std::function<void(const std::string& line)>;
  void SetLogger(Logger logger);

  // Push versions to replicas that have a data plane (see the class comment), each
  // executor round waiting at most `round_timeout` for a peer (a stalled or dead relay
  // costs that much before the replicas after it pull instead). Needs the data plane;
  // set before serving.
  void EnablePush(bool push, absl::Duration round_timeout = absl::Seconds(10));

  // Where FILE descriptors may point (the trainer's --publish_dir: regular files under
  // it, nothing else); empty (the default): FILE descriptors are refused. Set before
  // serving.
  void SetFileRoot(std::string root) { store_.SetFileRoot(std::move(root)); }
  // The largest version (image, or a sharded layout's tensors) accepted: sizes from a
  // request are checked against it before anything is allocated. Set before serving.
  void SetMaxVersionBytes(uint64_t bytes) { store_.SetMaxVersionBytes(bytes); }

  // How many of the newest versions keep their bytes (2..8: the latest stays syncable
  // while the next is pulled); set before serving.
  void SetKeepVersions(int versions) { store_.SetKeepVersions(versions); }

  // Whether a version published with the trainer's GPU copy waits for a destination that
  // needs its bytes before this service pulls them (true, the default: replicas on CUDA
  // devices of the trainer's host install from that copy, and no host copy is kept for
  // them) or is pulled at publish (false). Set before serving.
  void SetDeferHostCopy(bool defer) { store_.SetDeferHostCopy(defer); }

  // Faults in `bytes` of memory now for each of the next keep_versions versions pulled
  // (see --prefault_mib); set SetKeepVersions first.
  void PrefaultVersionMemory(uint64_t bytes) {
    store_.PrefaultMemory(bytes);
    if (push_ != nullptr) push_->PrefaultMemory(bytes);
  }

  // INVALID_ARGUMENT naming the field (replica_id, grpc_address, a layout of more than
  // 64 ranks or 4096 tensors); UNIMPLEMENTED for ranks or wire_dtype (see
  // weights_requests.h).
  absl::Status RegisterDestination(const v1::RegisterDestinationRequest& request,
                                   v1::RegisterDestinationResponse* response);
  absl::Status UnregisterDestination(const v1::UnregisterDestinationRequest& request,
                                     v1::UnregisterDestinationResponse* response);
  // Either one source rank with one shard: the trainer's safetensors image (its file, or
  // its memory pulled over the data plane) with its length and digest; or a version
  // sharded over the trainer's ranks: the manifest's layout (world_size ranks, each
  // tensor FSDP-flat, TP rows / columns or replicated) and from every rank one
  // descriptor per tensor (SourceShard.tensor_name), each pulled and digest-checked and
  // the tensors assembled whole here (needs the data plane). Every field is checked
  // first (weights_requests.h: ranks in their own type, sizes against
  // SetMaxVersionBytes before anything is allocated, a FILE descriptor only under
  // SetFileRoot's root). INVALID_ARGUMENT naming the field for what does not fit,
  // UNIMPLEMENTED for a field not supported; the same version again with the same digest (or the
  // same sharded manifest) is already published (OK, nothing read); FAILED_PRECONDITION for another version not newer
  // than the latest; NOT_FOUND for a file that cannot be read; the data plane's error for memory that cannot be pulled
  // (UNAVAILABLE: the trainer is gone); DATA_LOSS when the bytes do not match the digest
  // (the version is not published).
  absl::Status PublishVersion(const v1::PublishVersionRequest& request, v1::PublishVersionResponse* response);
  // One destination (version 0 = the latest). NOT_FOUND for an unknown destination or
  // version; the destination's error (DEADLINE_EXCEEDED past timeout_ms, UNAVAILABLE
  // for a dead replica), its status recorded as FAILED.
  absl::Status SyncVersion(const v1::SyncVersionRequest& request, v1::SyncVersionResponse* response);
  // Every registered destination in parallel, each under `timeout` (pushed in chains
  // where it can be, else pulled); returns each one's final status. NOT_FOUND for an
  // unknown version.
  absl::StatusOr<std::vector<v1::DestinationSyncStatus>> SyncAll(uint64_t version, absl::Duration timeout);
  // The same for the destinations `ids` (empty: all); NOT_FOUND naming one not registered.
  absl::StatusOr<std::vector<v1::DestinationSyncStatus>> SyncSome(uint64_t version, std::vector<std::string> ids,
                                                                  absl::Duration timeout);
  // The reshard plan of a version for one destination (libs/reshard): the version's
  // tensors (from its manifest's layout, else its safetensors header) in the trainer's
  // layout (the manifest's, else one rank holding everything) to the destination's
  // registered layout (else one rank holding everything); per (source rank,
  // destination rank) the ranges and bytes, bytes needed and planned, and the replica
  // it got the version from. NOT_FOUND for an unknown version or destination;
  // INVALID_ARGUMENT for max_ranges over 100000 or a layout the planner refuses (named);
  // FAILED_PRECONDITION when the version's tensors are unknown or the destination's
  // layout lacks one of them.
  absl::Status GetPlan(const v1::GetPlanRequest& request, v1::GetPlanResponse* response);
  // NOT_FOUND for an unknown version or destination.
  absl::Status GetSyncStatus(const v1::GetSyncStatusRequest& request, v1::GetSyncStatusResponse* response);

 private:
  struct Registered {
    std::string grpc_address;
    std::shared_ptr<Destination> destination;
    v1::ShardLayout layout;  // world_size 0: one rank holding everything
    bool can_relay = false;  // may forward the bytes to other destinations
  };
  class PushObserver;
  // One replica's pull of `version` (0: the latest), relayed where the tree says.
  // Bytes::kNotNeeded: the replica installs the trainer's GPU copy (its fallback chunk
  // is the trainer's memory), so a deferred host copy is not pulled for it.
  // `acquired`: the lease the caller already took (its error, if it failed), not taken again.
  absl::StatusOr<v1::DestinationSyncStatus> Pull(const std::string& replica_id, uint64_t version,
                                                 absl::Duration timeout,
                                                 VersionStore::Bytes bytes = VersionStore::Bytes::kNeeded,
                                                 const absl::StatusOr<Lease>* acquired = nullptr);
  // Records a sync of `version` to `replica_id` that could not start as FAILED with `why`
  // (a replica already INSTALLED at it keeps that).
  void RecordFailed(const std::string& replica_id, uint64_t version, const absl::Status& why);
  // Of `ids`, the replicas that install `version` from the trainer's GPU copy
  // (TakesDeviceImage, from each one's GetInfo; one that does not answer is not among
  // them) when its host copy is deferred; none otherwise.
  std::vector<std::string> DeviceImageTakers(uint64_t version, const std::vector<std::string>& ids,
                                             absl::Time deadline);
  // Pushes `version` along `chain`; returns the replicas it did not install on.
  std::vector<std::string> PushChain(const Lease& version, const std::vector<std::string>& chain, absl::Time deadline);
  // The version a sync of `ids` means (0: the latest). NOT_FOUND for a version not
  // published or an id not registered.
  absl::StatusOr<uint64_t> ResolveSync(uint64_t version, const std::vector<std::string>& ids);
  // Records an install in the destination's status and the log.
  v1::DestinationSyncStatus RecordInstalled(v1::DestinationSyncStatus s, const std::string& from,
                                            const v1::CommitWeightsResponse& installed, absl::Duration took,
                                            bool pushed);
  void Log(const std::string& line) const {
    if (logger_) logger_(line);
  }

  const DestinationFactory factory_;
  transport::Transport* const data_plane_;
  Logger logger_;
  VersionStore store_;
  RelayTree relay_;
  std::unique_ptr<PushChains> push_;  // null: versions are pulled
  absl::Duration push_round_timeout_ = absl::Seconds(10);
  absl::Mutex mu_;
  std::map<std::string, Registered> destinations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlfleet::weights

#endif  // RLFLEET_SERVICES_WEIGHTS_WEIGHTS_CORE_H_

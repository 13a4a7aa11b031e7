// VersionStore: the weights service's published versions, without gRPC. Publish reads
// a version the trainer wrote (its safetensors file, its memory over the data plane, or
// one shard per trainer rank and tensor, assembled whole here), checks every digest
// before anything sees it, and keeps it: the newest keep_versions with their bytes
// (registered on the data plane when there is one), the newest 8 as records (manifest,
// tensors, layout and each destination's sync status).
//
// A sync takes a Lease on a version's bytes. A version that falls out of the kept ones
// is refused to new syncs at once (FAILED_PRECONDITION naming --keep_versions); its
// memory goes back to the pool, for the next version's pull, when its last lease ends.
//
// A version published with the trainer's GPU copy (a device image) is, by default, not
// pulled at publish: replicas on CUDA devices of the trainer's host install from that
// copy, and its bytes come here only when a sync needs them (a destination that does
// not take the device image, or a push round), from the trainer's memory while the
// trainer holds the version (its latest two). So the host copy is kept only where a
// destination needs it, and the trainer's publish does not wait for a pull no one uses.
// Its own lock; thread-safe.
#ifndef RLFLEET_SERVICES_WEIGHTS_VERSION_STORE_H_
#define RLFLEET_SERVICES_WEIGHTS_VERSION_STORE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/common/host_buffer.h"
#include "libs/reshard/plan.h"
#include "libs/transport/transport.h"
#include "rlfleet/v1/rollout.pb.h"
#include "rlfleet/v1/weights.pb.h"

namespace rlfleet::weights {

// What a published version is; fixed once published, kept with its record.
struct VersionInfo {
  uint64_t number = 0;
  v1::WeightManifest manifest;
  std::vector<reshard::TensorSpec> tensors;  // from the manifest's layout or the image's header
  reshard::Layout layout;                    // the trainer's (one rank holding all: no layout)
  v1::TransferDescriptor location;           // the whole image: the trainer's file, or its length and digest
  v1::CudaIpcImage device_image;             // the trainer's GPU copy (same-host CUDA replicas); unset: none
  int64_t trainer_pause_us = 0;
  int64_t read_us = 0;
};

// Whether the replica `info` describes installs `version` from the trainer's GPU copy
// (a CUDA device on the host of its device image) rather than from this service.
bool TakesDeviceImage(const VersionInfo& version, const v1::GetInfoResponse& info);

// A version's bytes while it is kept or leased: deregistered from the data plane, and
// its memory given to the store's pool, when the last holder lets go.
class VersionImage {
 public:
  VersionImage(common::HostBuffer bytes, transport::Transport* data_plane)
      : bytes_(std::move(bytes)), data_plane_(data_plane) {}
  ~VersionImage();
  VersionImage(const VersionImage&) = delete;
  VersionImage& operator=(const VersionImage&) = delete;

  // Registers the bytes with the data plane and describes them as `version` with
  // `digest`; the data plane's error otherwise.
  absl::Status Stage(uint64_t version, const v1::Digest& digest);

  const std::string& bytes() const { return bytes_.str(); }
  bool staged() const { return registered_.has_value(); }
  const v1::TransferDescriptor& staging() const { return staging_; }  // the bytes on the data plane

 private:
  common::HostBuffer bytes_;  // (its memory goes back to its pool after the deregistration)
  transport::Transport* const data_plane_;
  std::optional<transport::MemoryHandle> registered_;
  v1::TransferDescriptor staging_;
};

// A version held for a sync: what it is, and its bytes (null when it is served from the
// trainer's file).
struct Lease {
  std::shared_ptr<const VersionInfo> info;
  std::shared_ptr<const VersionImage> image;
  // Where a replica pulls it from: this service's memory, else the trainer's file.
  const v1::TransferDescriptor& Source() const {
    return image != nullptr && image->staged() ? image->staging() : info->location;
  }
};

class VersionStore {
 public:
  // With a `data_plane` (not owned), versions are kept in memory registered with it and
  // replicas pull them from there; without one they read the trainer's file.
  explicit VersionStore(transport::Transport* data_plane);
  ~VersionStore();

  using Logger = std::function<void(const std::string& line)>;
  // One line per published version; called without the store's lock. Set before use.
  void SetLogger(Logger logger) { logger_ = std::move(logger); }
  // Where FILE descriptors may point (the trainer's --publish_dir); empty: refused.
  void SetFileRoot(std::string root) { file_root_ = std::move(root); }
  // Whether versions published with a device image wait for a destination that needs
  // their bytes before they are pulled (default), or are pulled at publish (false).
  void SetDeferHostCopy(bool defer) { defer_host_copy_ = defer; }
  // The largest version accepted, checked before anything is allocated.
  void SetMaxVersionBytes(uint64_t bytes) { max_version_bytes_ = bytes; }
  uint64_t max_version_bytes() const { return max_version_bytes_; }
  // How many of the newest versions keep their bytes (2..8).
  void SetKeepVersions(int versions);
  int keep_versions() const { return keep_versions_; }
  // Faults in `bytes` of memory now for each of the next keep_versions versions.
  void PrefaultMemory(uint64_t bytes);

  // See WeightsCore::PublishVersion for what is accepted and each error. Each of
  // `destinations` gets a PENDING status for the new version.
  absl::Status Publish(const v1::PublishVersionRequest& request, const std::vector<std::string>& destinations,
                       v1::PublishVersionResponse* response);

  // The version `version` means (0: the latest); NOT_FOUND when it has no record.
  absl::StatusOr<uint64_t> Resolve(uint64_t version) const;
  // The latest version's record, or null when none is published.
  std::shared_ptr<const VersionInfo> Latest() const;
  // A version's record (0: the latest); NOT_FOUND when it has none.
  absl::StatusOr<std::shared_ptr<const VersionInfo>> Info(uint64_t version) const;
  // A version with its bytes, held until the lease is dropped (0: the latest); NOT_FOUND
  // for one never published or whose record is gone, FAILED_PRECONDITION for one whose
  // bytes were given up (older than the kept ones). A version whose host copy was
  // deferred is pulled from the trainer now (the data plane's error, annotated, when the
  // trainer no longer holds it); with Bytes::kNotNeeded (a sync to a replica that takes
  // the device image) it is not, and the lease's Source() is the trainer's memory.
  // A pull on demand gives up at `deadline` (the sync's).
  enum class Bytes { kNeeded, kNotNeeded };
  absl::StatusOr<Lease> Acquire(uint64_t version, Bytes bytes = Bytes::kNeeded,
                                absl::Time deadline = absl::InfiniteFuture());
  // Whether `version` (0: the latest) was published without its host copy and has not
  // been pulled since (false for one without a record).
  bool HostCopyDeferred(uint64_t version) const;

  // Each destination's sync status of a version: SetStatus replaces one (nothing when
  // the version's record is gone); StatusOf reads one; Statuses all of them (NOT_FOUND
  // for a version without a record).
  void SetStatus(uint64_t version, const v1::DestinationSyncStatus& status);
  std::optional<v1::DestinationSyncStatus> StatusOf(uint64_t version, const std::string& replica_id) const;
  absl::StatusOr<std::vector<v1::DestinationSyncStatus>> Statuses(uint64_t version) const;

  static constexpr int kRecords = 8;  // versions whose records are kept
  // Versions a trainer keeps in its memory (its latest two): a deferred host copy older
  // than that can no longer be pulled.
  static constexpr int kTrainerKeeps = 2;

 private:
  struct Record {
    std::shared_ptr<const VersionInfo> info;
    std::shared_ptr<const VersionImage> image;  // null once given up, or while its host copy is deferred
    // The trainer's request, while the host copy is deferred: what the pull on demand
    // reads (null once pulled or given up).
    std::shared_ptr<const v1::PublishVersionRequest> deferred;
    bool pulling = false;                                     // a sync is pulling the deferred host copy now
    std::map<std::string, v1::DestinationSyncStatus> status;  // by replica_id
  };
  // Pulls a deferred version's bytes from the trainer (one pull per version at a time,
  // the others waiting for it until their deadline), records them and returns a lease.
  absl::StatusOr<Lease> PullDeferred(uint64_t version, absl::Time deadline);
  // Reads (or pulls, or assembles) the version's bytes into memory from the pool, and
  // checks them; fills `where` with the image's descriptor.
  absl::StatusOr<common::HostBuffer> Read(const v1::PublishVersionRequest& request, bool sharded,
                                          v1::TransferDescriptor* where,
                                          absl::Time deadline = absl::InfiniteFuture()) const;
  // The record of `version` (0: the latest); NOT_FOUND when it has none.
  absl::StatusOr<const Record*> FindLocked(uint64_t version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Log(const std::string& line) const {
    if (logger_) logger_(line);
  }

  transport::Transport* const data_plane_;
  const std::shared_ptr<common::BufferPool> pool_;  // retired versions' memory, largest first
  Logger logger_;
  std::string file_root_;
  uint64_t max_version_bytes_ = uint64_t{16} << 30;
  int keep_versions_ = 2;
  bool defer_host_copy_ = true;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Record> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlfleet::weights

#endif  // RLFLEET_SERVICES_WEIGHTS_VERSION_STORE_H_

// How a rollout replica takes in weight versions, without gRPC (the service's
// UpdateWeights is a thin adapter over Update):
//
//   FILE     a regular file under the fetcher's root (--publish_dir), read on the
//            caller's thread (never the scheduler's), its digest checked
//   pulled   the weights service's or another replica's memory, fetched over this
//            replica's data plane into the memory of the image before last, digest
//            checked; with serve_relay the installed image is then served from here
//            (RelayCopy) for the next replica to pull
//   pushed   the weights service's resharding round (ShardReceiver): every tensor
//            whole into shard memory, relayed on chunk by chunk when the round says
//            forward_to, the digest shares checked (a mapped round: on a private copy)
//   device   the trainer's GPU copy on this host (CUDA IPC: request.device_image), one
//            device-to-device copy at the step boundary, its digest checked first; a
//            replica elsewhere or on the CPU ignores it, and a failed one falls back
//            to the request's other source
//
// Every request field is honoured or refused naming it (Check) before anything is
// fetched or allocated. Thread-safe; one pushed version at a time.
#ifndef RLFLEET_SERVICES_ROLLOUT_WEIGHT_INTAKE_H_
#define RLFLEET_SERVICES_ROLLOUT_WEIGHT_INTAKE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/host_buffer.h"
#include "libs/reshard/round.h"
#include "libs/transport/descriptor_fetcher.h"
#include "libs/transport/transport.h"
#include "rlfleet/v1/rollout.pb.h"
#include "services/rollout/rollout_core.h"

namespace rlfleet::rollout {

// This replica's copy of the last version it pulled, registered on its data plane so
// that other replicas can pull it from here (the weights service's relay tree): one
// copy of the model in memory. A newer copy replaces it (a replica still pulling the
// old one then fails with a stale key, and the weights service sends it elsewhere).
// Thread-safe.
class RelayCopy {
 public:
  explicit RelayCopy(transport::Transport* data_plane) : data_plane_(data_plane) {}
  ~RelayCopy();
  RelayCopy(const RelayCopy&) = delete;
  RelayCopy& operator=(const RelayCopy&) = delete;
  // Serves `bytes` (taken over: the installed image, not a copy of it), the version
  // `pulled` describes; returns where to pull it (same length, digest and version).
  // The image it served before, no longer registered, is dropped (its memory goes back
  // to its pool: the next pull's). Errors from registering it.
  absl::StatusOr<v1::TransferDescriptor> Serve(common::HostBuffer bytes, const v1::TransferDescriptor& pulled);

 private:
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  transport::Transport* const data_plane_;
  absl::Mutex mu_;
  common::HostBuffer bytes_ ABSL_GUARDED_BY(mu_);
  std::optional<transport::MemoryHandle> handle_ ABSL_GUARDED_BY(mu_);
};

class WeightIntake {
 public:
  // `core` (not owned) installs what comes in. `fetcher` (not owned; may be null: no
  // FILE and no pulls) fetches descriptors; `data_plane` (not owned; may be null: no
  // relay copies and no pushes) serves relay copies and receives pushed rounds.
  WeightIntake(RolloutCore* core, transport::DescriptorFetcher* fetcher, transport::Transport* data_plane);

  // Faults in memory for one pulled version of `bytes` now, so that the first pull does
  // not: in a single-version sync of a 404 MB policy, a fresh buffer was 0.87-0.99 s of
  // each replica's ~1 s pull on our VM (bench/weights_service.py). Later versions reuse
  // their predecessors' memory anyway. Pushed versions land in shard memory of the
  // transport's, faulted in here too.
  void PrefaultStaging(uint64_t bytes);

  // Every field of an UpdateWeights request, before anything is fetched or allocated:
  // honoured, or refused naming it (INVALID_ARGUMENT; UNIMPLEMENTED for what this
  // replica does not support: docs/unsupported_fields.md).
  absl::Status Check(const v1::PrepareWeightsRequest& request) const;

  // Checks `request`, then takes in and installs the version it describes (at the next
  // decode-step boundary: in-flight sequences continue on it), by
  // transfer_timeout_ms (0: 60 s) and never after `deadline` (the call's). Fills
  // `response` (installed version, pull and install timings, relay_source when this
  // replica now serves the version to others).
  absl::Status Update(const v1::PrepareWeightsRequest& request, absl::Time deadline,
                      v1::CommitWeightsResponse* response);

  // Whether versions from the trainer's GPU copy (request.device_image) have their
  // digest checked too (one more read pass over them); their stamp is always checked.
  void set_verify_device_images(bool verify) { verify_device_images_ = verify; }

  // The data plane other replicas pull from here over (UCX), in GetInfo's reply.
  void DescribeDataPlane(v1::GetInfoResponse* response) const;

 private:
  // From request.device_image when this replica is on a CUDA device of its host: true
  // once installed, false when this replica cannot use it; errors of the install.
  absl::StatusOr<bool> UpdateFromDevice(const v1::PrepareWeightsRequest& request, absl::Time deadline,
                                        v1::CommitWeightsResponse* response);
  absl::Status UpdateFromFile(const v1::PrepareWeightsRequest& request, absl::Time deadline,
                              v1::CommitWeightsResponse* response);
  absl::Status UpdateByPull(const v1::PrepareWeightsRequest& request, absl::Time deadline,
                            v1::CommitWeightsResponse* response);
  absl::Status UpdateFromRound(const v1::PrepareWeightsRequest& request, absl::Time deadline,
                               v1::CommitWeightsResponse* response);
  absl::Status ReceiveAndInstallLocked(const v1::PrepareWeightsRequest& request, absl::Time deadline, uint64_t most,
                                       v1::CommitWeightsResponse* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(receive_mu_);
  // The largest image this replica's model can have (sizes from the network are held to it).
  absl::StatusOr<uint64_t> MostImageBytes() const;

  RolloutCore* const core_;
  const std::string device_;  // the core's ("cpu", "cuda:0")
  bool verify_device_images_ = false;
  transport::DescriptorFetcher* const fetcher_;
  transport::Transport* const data_plane_;
  const std::unique_ptr<RelayCopy> relay_;
  // Pushed versions: one round at a time, and the shard untouched until installed.
  absl::Mutex receive_mu_;
  const std::unique_ptr<reshard::ShardReceiver> receiver_ ABSL_PT_GUARDED_BY(receive_mu_);
  // Pulled images' memory, kept for the next pull (with a relay: the image it served
  // before the current one comes back here when the next is served).
  const std::shared_ptr<common::BufferPool> staging_ = std::make_shared<common::BufferPool>(1);
};

// An install's report in an UpdateWeights reply.
void ReportInstall(const InstallReport& report, v1::CommitWeightsResponse* response);

}  // namespace rlfleet::rollout

#endif  // RLFLEET_SERVICES_ROLLOUT_WEIGHT_INTAKE_H_

// What WeightsService accepts from the network, checked before the core acts on it:
// every number in its own type before a cast or an allocation, every size bounded,
// every field either honoured (and checked here) or refused naming it (INVALID_ARGUMENT
// for a value out of range, UNIMPLEMENTED for a field this service does not support;
// docs/unsupported_fields.md lists those). Pure functions; thread-safe.
#ifndef RLFLEET_SERVICES_WEIGHTS_WEIGHTS_REQUESTS_H_
#define RLFLEET_SERVICES_WEIGHTS_WEIGHTS_REQUESTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "rlfleet/v1/weights.pb.h"

namespace rlfleet::weights {

inline constexpr int kMaxSourceRanks = 1024;     // a publish's trainer ranks
inline constexpr int kMaxDestinationRanks = 64;  // a destination's TP ranks
inline constexpr int kMaxTensors = 4096;         // a layout's tensors
inline constexpr int kMaxReplicaIds = 1024;      // SyncVersion.replica_ids
inline constexpr int64_t kMaxSyncTimeoutMs = int64_t{24} * 3600 * 1000;

// A publish: the manifest (version, run id, layout, shard digests, wire dtype, total
// bytes, time), the sources (ranks, shards, descriptors) and the caller's numbers.
// `sharded` says which of the two forms it is (see WeightsCore::PublishVersion);
// `max_version_bytes` bounds what the layout or total_bytes may describe.
absl::Status CheckPublishVersion(const v1::PublishVersionRequest& request, bool sharded, uint64_t max_version_bytes);

// A registration: replica_id, grpc_address, the layout (at most 64 ranks, 4096
// tensors, shapes bounded); ranks and wire_dtype are refused (UNIMPLEMENTED).
absl::Status CheckRegisterDestination(const v1::RegisterDestinationRequest& request);

// A sync: timeout_ms in 0..24 h, commit (false is UNIMPLEMENTED: a version is always
// installed), replica_id / replica_ids (at most 1024, none empty).
absl::Status CheckSyncVersion(const v1::SyncVersionRequest& request);

}  // namespace rlfleet::weights

#endif  // RLFLEET_SERVICES_WEIGHTS_WEIGHTS_REQUESTS_H_

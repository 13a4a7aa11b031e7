// Identifiers: random, collision-resistant ids for replicas, runs, leases and
// experiences, and validation of ids that arrive from outside.
#ifndef RLFLEET_LIBS_COMMON_IDS_H_
#define RLFLEET_LIBS_COMMON_IDS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace rlfleet::common {

// Longest id accepted from a peer, in bytes.
inline constexpr size_t kMaxIdBytes = 128;

// Returns "<prefix>-<16 lowercase hex digits>" with 64 random bits from a
// cryptographically seeded generator, e.g. NewId("rollout") -> "rollout-9f0c2a...".
// Thread-safe.
std::string NewId(absl::string_view prefix);

// OK if `id` is 1..kMaxIdBytes bytes of [A-Za-z0-9._:-]; else INVALID_ARGUMENT naming
// `field` and the reason.
absl::Status ValidateId(absl::string_view field, absl::string_view id);

// This host's identity for what only processes of one kernel share (CUDA IPC between
// GPU processes): the kernel's boot id (/proc/sys/kernel/random/boot_id), the same in
// every container on the host and new at every boot; empty where it cannot be read.
// Read once.
const std::string& HostId();

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_IDS_H_

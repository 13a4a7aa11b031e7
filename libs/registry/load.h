// What a replica may report as its load and version (Register, Heartbeat): the ranges
// the registry accepts, the check, and the clamp a replica applies to its own gauges.
// Free of Redis and gRPC: the registrar (in every service) and the registry share it.
#ifndef RLFLEET_LIBS_REGISTRY_LOAD_H_
#define RLFLEET_LIBS_REGISTRY_LOAD_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rlfleet/v1/common.pb.h"

namespace rlfleet::registry {

// Load a replica may report: queue lengths and counts up to kMaxLoadCount, throughput
// up to kMaxTokensPerS, memory up to kMaxMemoryBytes (1 PiB), utilization in [0, 1].
inline constexpr uint32_t kMaxLoadCount = 1u << 20;
inline constexpr double kMaxTokensPerS = 1e9;
inline constexpr uint64_t kMaxMemoryBytes = uint64_t{1} << 50;

// Load and version as a heartbeat reports them: INVALID_ARGUMENT naming the field
// (`prefix` + "." + field) for a count over kMaxLoadCount, a throughput, utilization or
// memory that is not finite or out of range, an oversized run id or digest.
absl::Status ValidateLoad(const v1::LoadStats& load, absl::string_view prefix);
absl::Status ValidateVersion(const v1::PolicyVersion& version, absl::string_view prefix);

// Brings a replica's own load into the ranges ValidateLoad accepts (a non-finite number
// becomes 0, the rest is clamped), so that a replica whose gauges misbehave still
// heartbeats instead of losing its lease; the Registrar applies it before sending.
void ClampLoad(v1::LoadStats* load);

}  // namespace rlfleet::registry

#endif  // RLFLEET_LIBS_REGISTRY_LOAD_H_

#include "libs/registry/load.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "libs/common/checks.h"
#include "libs/common/status_macros.h"

namespace rlfleet::registry {

absl::Status ValidateLoad(const v1::LoadStats& load, absl::string_view prefix) {
  auto field = [&](absl::string_view name) { return absl::StrCat(prefix, ".", name); };
  RETURN_IF_ERROR(
      common::CheckInRange<uint32_t>(field("inflight_requests"), load.inflight_requests(), 0, kMaxLoadCount));
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>(field("queued_requests"), load.queued_requests(), 0, kMaxLoadCount));
  RETURN_IF_ERROR(common::CheckInRange<uint32_t>(field("active_sequences"), load.active_sequences(), 0, kMaxLoadCount));
  RETURN_IF_ERROR(common::CheckFiniteInRange(field("tokens_per_s"), load.tokens_per_s(), 0, kMaxTokensPerS));
  RETURN_IF_ERROR(
      common::CheckInRange<uint64_t>(field("memory_used_bytes"), load.memory_used_bytes(), 0, kMaxMemoryBytes));
  RETURN_IF_ERROR(
      common::CheckInRange<uint64_t>(field("memory_capacity_bytes"), load.memory_capacity_bytes(), 0, kMaxMemoryBytes));
  RETURN_IF_ERROR(common::CheckFiniteInRange(field("utilization"), load.utilization(), 0, 1));
  return absl::OkStatus();
}

void ClampLoad(v1::LoadStats* load) {
  auto clamp = [](double v, double hi) { return std::isfinite(v) ? std::clamp(v, 0.0, hi) : 0.0; };
  load->set_inflight_requests(std::min(load->inflight_requests(), kMaxLoadCount));
  load->set_queued_requests(std::min(load->queued_requests(), kMaxLoadCount));
  load->set_active_sequences(std::min(load->active_sequences(), kMaxLoadCount));
  load->set_tokens_per_s(clamp(load->tokens_per_s(), kMaxTokensPerS));
  load->set_memory_used_bytes(std::min(load->memory_used_bytes(), kMaxMemoryBytes));
  load->set_memory_capacity_bytes(std::min(load->memory_capacity_bytes(), kMaxMemoryBytes));
  load->set_utilization(clamp(load->utilization(), 1.0));
}

absl::Status ValidateVersion(const v1::PolicyVersion& version, absl::string_view prefix) {
  if (version.run_id().size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ".run_id is over 128 bytes"));
  }
  if (version.digest().size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ".digest is over 256 bytes"));
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::registry

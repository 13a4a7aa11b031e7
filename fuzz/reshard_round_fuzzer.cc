// libFuzzer harness: a v1::ReshardRound parsed from arbitrary bytes, planned as both
// sides of a round plan it (PlanOfRound), then the digest shares a source computes
// over its (zeroed) shard when the plan is small. Planning must end in a plan or
// INVALID_ARGUMENT, with bounded work, and a plan must be self-consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "libs/reshard/round.h"
#include "rlfleet/v1/common.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rlfleet::v1::ReshardRound round;
  if (!round.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<rlfleet::reshard::Plan> plan = rlfleet::reshard::PlanOfRound(round);
  if (!plan.ok()) {
    if (plan.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (plan->src_shard_bytes.empty() || plan->dst_shard_bytes.empty()) std::abort();
  if (plan->src_shard_bytes[0] <= (1u << 20)) {
    const std::vector<uint8_t> shard(plan->src_shard_bytes[0] + 1, 0);
    auto shares = rlfleet::reshard::SourceDigestShares(*plan, 0, shard.data());
    if (shares.ok() && shares->size() != plan->dst_shard_bytes.size()) std::abort();
  }
  return 0;
}

// A resharding round as the control plane carries it (v1::ReshardRound): the weights
// service pushes a version to rollout replicas through the executor, each replica
// receiving only its layout's bytes, relayed chunk by chunk along a chain of replicas
// with the same layout.
//
//   PlanOfRound       both sides derive the same Plan from the round's two layouts
//   SourceDigestShares what a source computes before the round, so that every
//                     destination can check what it received (no second message)
//   ShardReceiver     a destination rank's side: its shard memory, kept and reused
//                     from version to version (allocated with the transport, so
//                     same-host senders store straight into it), the round, the check
//
// Every wait has the round's deadline; a source or relay that dies is the transport's
// UNAVAILABLE (or DEADLINE_EXCEEDED at the round timeout), never a hang.
#ifndef RLFLEET_LIBS_RESHARD_ROUND_H_
#define RLFLEET_LIBS_RESHARD_ROUND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/reshard/executor.h"
#include "libs/reshard/plan.h"
#include "libs/transport/transport.h"
#include "rlfleet/v1/common.pb.h"

namespace rlfleet::reshard {

// The planner's dtype and split of a proto one; INVALID_ARGUMENT naming `tensor` for one
// the planner does not move.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view tensor);
absl::StatusOr<Split> SplitFromProto(v1::LayoutKind kind, absl::string_view tensor);
v1::DType DTypeToProto(DType dtype);
v1::LayoutKind SplitToProto(Split split);

// A model's tensors and their layout, from a ShardLayout. INVALID_ARGUMENT naming
// `field` (and the tensor) for no tensors or more than 4096, world_size outside
// 1..`max_ranks`, a name given twice, a dtype or kind the planner does not know.
struct ModelLayout {
  std::vector<TensorSpec> tensors;
  Layout layout;
};
absl::StatusOr<ModelLayout> ModelLayoutFromProto(const v1::ShardLayout& proto, absl::string_view field, int max_ranks);
v1::ShardLayout ModelLayoutToProto(const std::vector<TensorSpec>& tensors, const Layout& layout);

// The plan of a round: the source layout's tensors, from the source layout to the
// destination layout (matched by name; no tensors there: one rank holding every
// tensor whole). INVALID_ARGUMENT naming the field for a layout that does not fit (a
// tensor missing, another shape or dtype), a rank outside the destination layout, a
// source address or digest share count that is not one per source rank, tag_epoch
// over 15, round_timeout_ms outside 0..1 hour; and, before planning, a plan whose
// work passes MakePlan's bound (ranks x ranks x tensors, column-split rows).
absl::StatusOr<Plan> PlanOfRound(const v1::ReshardRound& round);

// Source rank `src_rank`'s share of every destination rank's shard digest, from its
// shard (plan.src_shard_bytes[src_rank] bytes at `shard`): what Execute's
// digest_shares will be, computed without moving anything. Plans without casts only
// (INVALID_ARGUMENT otherwise).
absl::StatusOr<std::vector<uint64_t>> SourceDigestShares(const Plan& plan, int src_rank, const uint8_t* shard);

// A destination rank's side of rounds, one at a time. Not thread-safe.
class ShardReceiver {
 public:
  explicit ShardReceiver(transport::Transport& transport);
  ~ShardReceiver();
  ShardReceiver(const ShardReceiver&) = delete;
  ShardReceiver& operator=(const ShardReceiver&) = delete;

  // Allocates and faults in `bytes` of shard memory now, so that the first round does
  // not pay for fresh pages.
  absl::Status Prefault(uint64_t bytes);

  struct Received {
    Plan plan;
    int rank = 0;
    const uint8_t* shard = nullptr;  // plan.dst_shard_bytes[rank] bytes; valid until the next Receive
    // The shard is a private copy: the round was mapped, so the senders could still
    // store into the shard memory itself after it was checked (see Receive).
    bool private_copy = false;
    ExecutionStats stats;
    absl::Duration allocate, transfer, verify;
    uint64_t bytes_received = 0;  // bytes of the shard's parts (the layout's bytes)
    // Tensor t of the plan as this rank holds it (empty when it holds none of it).
    absl::string_view Part(size_t t) const;
  };
  // Joins `round` (connecting to its sources or relay and its forward peer), receives
  // this rank's shard and verifies it against the round's digest shares. What is
  // verified is what is used: in a mapped round (map_peer_memory) a same-host sender
  // or relay keeps a mapping of the shard memory and could store into it after the
  // check, so the shard is copied into this receiver's private memory, digested in the
  // same pass, and the copy is verified and returned (one more pass over the shard and
  // one more shard of memory, kept for the next round). Errors:
  // PlanOfRound's; the transport's (UNAVAILABLE: a source or relay died; DEADLINE_EXCEEDED:
  // a round stalled past round_timeout_ms or `deadline` passed); DATA_LOSS when the
  // digest does not match (nothing may be installed from it); INVALID_ARGUMENT naming
  // source_layout, before any memory is taken, for a shard over `max_shard_bytes` (what
  // the caller can hold: the sizes come from the network).
  absl::StatusOr<Received> Receive(const v1::ReshardRound& round, absl::Time deadline,
                                   uint64_t max_shard_bytes = ~uint64_t{0});

 private:
  absl::StatusOr<transport::MemoryHandle> Shard(uint64_t bytes);
  transport::Transport& transport_;
  StagingPool pool_;
  transport::MemoryHandle shard_;
  std::unique_ptr<MemoryOps> ops_;
  std::string private_;  // the verified copy of a mapped round's shard
};

}  // namespace rlfleet::reshard

#endif  // RLFLEET_LIBS_RESHARD_ROUND_H_

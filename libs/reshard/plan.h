// The resharding planner: pure code, no I/O.
//
// Trainer ranks hold each parameter in a training layout (FSDP: the tensor flattened
// and split evenly over D ranks; or TP: split by rows or columns over D ranks). A
// rollout replica wants its own TP layout over T ranks. MakePlan() takes the tensor
// metadata and both layouts and returns, for every (source rank, destination rank),
// the coalesced byte ranges to move, so that each destination receives exactly the
// bytes it needs: bytes moved / bytes needed = 1, and no rank gathers a whole tensor it
// does not own.
//
// Shards. Every rank of a layout holds one contiguous "shard buffer": for each tensor
// in order, its part of that tensor, row-major, starting at a 16-byte aligned offset
// (the gaps are padding and are never moved). The parts:
//   kFlat        elements [r*c, (r+1)*c) of the flattened tensor, c = ceil(numel / ranks)
//   kRows        rows [r*c, (r+1)*c) of dimension 0, c = ceil(shape[0] / ranks)
//   kColumns     columns [r*c, (r+1)*c) of dimension 1 (rank >= 2 tensors), same c
//   kReplicated  the whole tensor
// (the ceil split is torch.chunk's: the last ranks may get less, or nothing.) A
// replicated source supplies only its kFlat part, so the work is spread over ranks.
//
// Casting. With cast_f32_to_bf16, f32 tensors are bf16 in the destination layout; the
// sender casts on the way, so the wire carries destination bytes.
#ifndef RLFLEET_LIBS_RESHARD_PLAN_H_
#define RLFLEET_LIBS_RESHARD_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "libs/reshard/dtype.h"

namespace rlfleet::reshard {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;
  uint64_t numel() const;
};

enum class Split { kFlat, kRows, kColumns, kReplicated };
const char* SplitName(Split split);

struct Layout {
  int ranks = 1;
  std::vector<Split> splits;  // one per tensor

  // FSDP: every tensor flattened and split over `ranks`.
  static Layout Fsdp(int ranks, size_t num_tensors);
  // TP: tensor i split as per_tensor[i] over `ranks`.
  static Layout Tp(int ranks, std::vector<Split> per_tensor);
};

// `elements` consecutive elements from a source shard buffer to a destination shard
// buffer. Offsets are bytes into the two buffers; the element sizes differ when cast.
struct Range {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t elements = 0;
  uint32_t src_elem = 4;
  uint32_t dst_elem = 4;
  uint64_t src_bytes() const { return elements * src_elem; }
  uint64_t dst_bytes() const { return elements * dst_elem; }
  bool cast() const { return src_elem != dst_elem; }
};

// Where tensor `tensor`'s part sits in a shard buffer, and what it is.
struct ShardPart {
  uint64_t offset = 0;    // bytes into the shard buffer
  uint64_t elements = 0;  // 0 when this rank holds none of the tensor
  DType dtype = DType::kF32;
};

struct PlanOptions {
  bool cast_f32_to_bf16 = false;
};

struct Plan {
  std::vector<TensorSpec> tensors;
  Layout src;
  Layout dst;
  PlanOptions options;
  // [rank][tensor]
  std::vector<std::vector<ShardPart>> src_parts;
  std::vector<std::vector<ShardPart>> dst_parts;
  std::vector<uint64_t> src_shard_bytes;  // per source rank, including padding
  std::vector<uint64_t> dst_shard_bytes;  // per destination rank, including padding
  // ranges[s * dst.ranks + d]: what source rank s sends to destination rank d, in
  // increasing destination offset, coalesced.
  std::vector<std::vector<Range>> ranges;

  const std::vector<Range>& Between(int src_rank, int dst_rank) const {
    return ranges[static_cast<size_t>(src_rank) * dst.ranks + dst_rank];
  }
  // Sum over destination ranks of the bytes of their parts (padding excluded).
  uint64_t BytesNeeded() const;
  // Sum over all ranges of their destination bytes.
  uint64_t BytesMoved() const;
  // Number of ranges in the plan.
  uint64_t RangeCount() const;
};

// What a plan may hold, checked by MakePlan before it plans or allocates anything (its
// inputs may come from the network): ranks per side, tensors, elements per tensor, and
// the planning work (PlanCost).
inline constexpr int kMaxPlanRanks = 1 << 16;
inline constexpr size_t kMaxPlanTensors = 1 << 16;
inline constexpr uint64_t kMaxPlanElements = uint64_t{1} << 40;
inline constexpr uint64_t kMaxPlanCost = uint64_t{1} << 26;

// The number of elements of `shape` if every dimension is >= 1 and the product is at
// most kMaxPlanElements (checked before each multiplication, so it cannot overflow);
// INVALID_ARGUMENT "`what`: ..." otherwise. An empty shape is refused (callers that
// allow scalars pass {1}).
absl::StatusOr<uint64_t> CheckedElements(absl::string_view what, absl::Span<const int64_t> shape);

// An upper estimate of MakePlan's work (interval steps, about the ranges and parts it
// allocates): grows with ranks x ranks x tensors, and with the rows of column splits.
double PlanCost(const std::vector<TensorSpec>& tensors, const Layout& src, const Layout& dst);

// INVALID_ARGUMENT naming the tensor for: a layout without one split per tensor,
// ranks < 1, a shape with no or a non-positive dimension, kColumns on a 1-D tensor;
// and, before any planning, more than kMaxPlanRanks ranks or kMaxPlanTensors tensors,
// a tensor of more than kMaxPlanElements elements, or a PlanCost over kMaxPlanCost.
// (Any split may be used on either side: kFlat -> kFlat reshards FSDP checkpoints.)
absl::StatusOr<Plan> MakePlan(const std::vector<TensorSpec>& tensors, const Layout& src, const Layout& dst,
                              const PlanOptions& options = {});

// The part of `spec` that rank `rank` of `ranks` holds under `split`, as intervals of
// the flattened tensor: (first element, count, first element's index in the part).
struct Interval {
  uint64_t global = 0;
  uint64_t count = 0;
  uint64_t local = 0;
};
std::vector<Interval> PartIntervals(const TensorSpec& spec, Split split, int ranks, int rank);

}  // namespace rlfleet::reshard

#endif  // RLFLEET_LIBS_RESHARD_PLAN_H_

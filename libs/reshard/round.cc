#include "libs/reshard/round.h"

#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/common/huge_string.h"
#include "libs/common/status_macros.h"
#include "libs/reshard/digest.h"

namespace rlfleet::reshard {
namespace {

// The splits both ways (the dtypes: dtype.h's table).
constexpr std::pair<Split, v1::LayoutKind> kSplits[] = {{Split::kReplicated, v1::LAYOUT_KIND_REPLICATED},
                                                        {Split::kFlat, v1::LAYOUT_KIND_FSDP_FLAT},
                                                        {Split::kRows, v1::LAYOUT_KIND_TP_ROW},
                                                        {Split::kColumns, v1::LAYOUT_KIND_TP_COLUMN}};

constexpr int kMaxTensors = 4096;
constexpr int kMaxSourceRanks = 1024;
constexpr int kMaxDestinationRanks = 64;
// What a round may describe at most: a tensor's elements, a model's bytes (sizes come
// from the network: checked before anything is allocated or multiplied further).
constexpr uint64_t kMaxModelBytes = uint64_t{1} << 40;  // 1 TiB
constexpr uint64_t kMinChunkBytes = 256, kMaxChunkBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxChunks = uint64_t{1} << 20;  // chunks of the whole plan
constexpr int64_t kMaxRoundTimeoutMs = 3600 * 1000;

}  // namespace

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view tensor) {
  if (std::optional<DType> ours = DTypeOfProto(dtype)) return *ours;
  return absl::InvalidArgumentError(
      absl::StrCat("tensor `", tensor, "`: dtype ", v1::DType_Name(dtype), " is not one the planner moves"));
}

absl::StatusOr<Split> SplitFromProto(v1::LayoutKind kind, absl::string_view tensor) {
  for (const auto& [ours, theirs] : kSplits) {
    if (theirs == kind) return ours;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tensor `", tensor, "`: layout kind ", v1::LayoutKind_Name(kind), " is not one the planner knows"));
}

v1::DType DTypeToProto(DType dtype) { return RowOf(dtype).proto; }

v1::LayoutKind SplitToProto(Split split) {
  for (const auto& [ours, theirs] : kSplits) {
    if (ours == split) return theirs;
  }
  return v1::LAYOUT_KIND_UNSPECIFIED;
}

absl::StatusOr<ModelLayout> ModelLayoutFromProto(const v1::ShardLayout& proto, absl::string_view field, int max_ranks) {
  if (proto.tensors_size() == 0 || proto.tensors_size() > kMaxTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".tensors: ", proto.tensors_size(), " tensors; want 1..", kMaxTensors));
  }
  if (proto.world_size() < 1 || proto.world_size() > static_cast<uint32_t>(max_ranks)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".world_size: ", proto.world_size(), "; want 1..", max_ranks));
  }
  ModelLayout out;
  out.layout.ranks = static_cast<int>(proto.world_size());
  std::map<std::string, int> seen;
  uint64_t model_bytes = 0;
  for (int i = 0; i < proto.tensors_size(); ++i) {
    const v1::TensorLayout& t = proto.tensors(i);
    const std::string& name = t.spec().name();
    if (!seen.emplace(name, i).second) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".tensors[", i, "]: `", name, "` given twice"));
    }
    absl::StatusOr<DType> dtype = DTypeFromProto(t.spec().dtype(), name);
    absl::StatusOr<Split> split = SplitFromProto(t.kind(), name);
    if (!dtype.ok() || !split.ok()) {
      return common::Annotate(!dtype.ok() ? dtype.status() : split.status(), absl::StrCat(field, ".tensors[", i, "]"));
    }
    TensorSpec spec{name, {t.spec().shape().begin(), t.spec().shape().end()}, *dtype};
    if (spec.shape.empty()) spec.shape = {1};  // a scalar
    ASSIGN_OR_RETURN(const uint64_t elements,
                     CheckedElements(absl::StrCat(field, ".tensors[", i, "].spec.shape: `", name, "`"), spec.shape));
    model_bytes += elements * DTypeSize(*dtype);
    if (model_bytes > kMaxModelBytes) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".tensors: more than 1 TiB of tensors"));
    }
    out.tensors.push_back(std::move(spec));
    out.layout.splits.push_back(*split);
  }
  return out;
}

v1::ShardLayout ModelLayoutToProto(const std::vector<TensorSpec>& tensors, const Layout& layout) {
  v1::ShardLayout out;
  out.set_world_size(layout.ranks);
  for (size_t i = 0; i < tensors.size(); ++i) {
    v1::TensorLayout* t = out.add_tensors();
    t->mutable_spec()->set_name(tensors[i].name);
    t->mutable_spec()->set_dtype(DTypeToProto(tensors[i].dtype));
    for (int64_t d : tensors[i].shape) t->mutable_spec()->add_shape(d);
    t->set_kind(SplitToProto(layout.splits[i]));
    if (layout.splits[i] == Split::kColumns) t->set_axis(1);
  }
  return out;
}

absl::StatusOr<Plan> PlanOfRound(const v1::ReshardRound& round) {
  ASSIGN_OR_RETURN(ModelLayout src, ModelLayoutFromProto(round.source_layout(), "source_layout", kMaxSourceRanks));
  Layout dst;
  if (round.destination_layout().tensors_size() == 0) {
    if (round.destination_layout().world_size() > static_cast<uint32_t>(kMaxDestinationRanks)) {
      return absl::InvalidArgumentError(
          absl::StrCat("destination_layout.world_size: ", round.destination_layout().world_size(), "; want 1..",
                       kMaxDestinationRanks));
    }
    dst = Layout::Tp(std::max<int>(1, static_cast<int>(round.destination_layout().world_size())),
                     std::vector<Split>(src.tensors.size(), Split::kReplicated));
  } else {
    ASSIGN_OR_RETURN(ModelLayout wanted,
                     ModelLayoutFromProto(round.destination_layout(), "destination_layout", kMaxDestinationRanks));
    if (wanted.tensors.size() != src.tensors.size()) {
      return absl::InvalidArgumentError(absl::StrCat("destination_layout.tensors: ", wanted.tensors.size(),
                                                     " tensors; the source layout has ", src.tensors.size()));
    }
    std::map<std::string, size_t> by_name;
    for (size_t i = 0; i < wanted.tensors.size(); ++i) by_name[wanted.tensors[i].name] = i;
    dst.ranks = wanted.layout.ranks;
    for (const TensorSpec& t : src.tensors) {
      auto it = by_name.find(t.name);
      if (it == by_name.end()) {
        return absl::InvalidArgumentError(absl::StrCat("destination_layout.tensors: no tensor `", t.name, "`"));
      }
      const TensorSpec& w = wanted.tensors[it->second];
      if (w.shape != t.shape || w.dtype != t.dtype) {
        return absl::InvalidArgumentError(absl::StrCat("destination_layout.tensors: `", t.name,
                                                       "` has another shape or dtype than in source_layout"));
      }
      dst.splits.push_back(wanted.layout.splits[it->second]);
    }
  }
  if (round.rank() >= static_cast<uint32_t>(dst.ranks)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", round.rank(), " is outside the destination layout's ", dst.ranks, " ranks"));
  }
  const int sources = src.layout.ranks;
  if (round.relay_from().empty() && round.source_addresses_size() != sources) {
    return absl::InvalidArgumentError(
        absl::StrCat("source_addresses: ", round.source_addresses_size(), " addresses for ", sources, " source ranks"));
  }
  if (round.digest_shares_size() != sources) {
    return absl::InvalidArgumentError(
        absl::StrCat("digest_shares: ", round.digest_shares_size(), " shares for ", sources, " source ranks"));
  }
  if (round.chunk_bytes() != 0 && (round.chunk_bytes() < kMinChunkBytes || round.chunk_bytes() > kMaxChunkBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes: ", round.chunk_bytes(), "; want 0 (16 MiB) or 256 B..1 GiB"));
  }
  if (round.tag_epoch() > 15) {
    return absl::InvalidArgumentError(absl::StrCat("tag_epoch: ", round.tag_epoch(), "; want 0..15"));
  }
  if (round.round_timeout_ms() < 0 || round.round_timeout_ms() > kMaxRoundTimeoutMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("round_timeout_ms: ", round.round_timeout_ms(), "; want 0 (10 s) .. ", kMaxRoundTimeoutMs));
  }
  ASSIGN_OR_RETURN(Plan plan, MakePlan(src.tensors, src.layout, dst));
  const uint64_t chunk = round.chunk_bytes() == 0 ? ExecutorOptions().chunk_bytes : round.chunk_bytes();
  if (plan.BytesMoved() / chunk > kMaxChunks) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_bytes: ", chunk, " cuts the plan's ", plan.BytesMoved(),
                                                   " bytes into more than 2^20 chunks"));
  }
  return plan;
}

absl::StatusOr<std::vector<uint64_t>> SourceDigestShares(const Plan& plan, int src_rank, const uint8_t* shard) {
  if (src_rank < 0 || src_rank >= plan.src.ranks) {
    return absl::InvalidArgumentError(absl::StrCat("source rank ", src_rank, " is outside the plan"));
  }
  std::vector<uint64_t> shares(plan.dst.ranks, 0);
  for (int d = 0; d < plan.dst.ranks; ++d) {
    for (const Range& r : plan.Between(src_rank, d)) {
      if (r.cast()) return absl::InvalidArgumentError("SourceDigestShares: the plan casts; shares need the cast bytes");
      shares[d] += DigestBytes(shard + r.src_offset, r.dst_bytes(), r.dst_offset);
    }
  }
  return shares;
}

absl::string_view ShardReceiver::Received::Part(size_t t) const {
  const ShardPart& part = plan.dst_parts[rank][t];
  return absl::string_view(reinterpret_cast<const char*>(shard) + part.offset, part.elements * DTypeSize(part.dtype));
}

ShardReceiver::ShardReceiver(transport::Transport& transport)
    : transport_(transport), pool_(transport), ops_(NewHostMemoryOps()) {}

ShardReceiver::~ShardReceiver() {
  if (shard_.id != 0) (void)transport_.DeregisterMemory(shard_);
}

absl::StatusOr<transport::MemoryHandle> ShardReceiver::Shard(uint64_t bytes) {
  bytes = std::max<uint64_t>(bytes, 1);
  if (shard_.id != 0 && shard_.length >= bytes) return shard_;
  if (shard_.id != 0) {
    (void)transport_.DeregisterMemory(shard_);
    shard_ = {};
  }
  // (AllocateMemory: memory a same-host sender can map and store into directly.)
  ASSIGN_OR_RETURN(shard_, transport_.AllocateMemory(bytes, transport::MemoryKind::kHost, 0));
  return shard_;
}

absl::Status ShardReceiver::Prefault(uint64_t bytes) {
  ASSIGN_OR_RETURN(transport::MemoryHandle shard, Shard(bytes));
  std::memset(shard.base, 0, shard.length);
  return absl::OkStatus();
}

absl::StatusOr<ShardReceiver::Received> ShardReceiver::Receive(const v1::ReshardRound& round, absl::Time deadline,
                                                               uint64_t max_shard_bytes) {
  Received out;
  ASSIGN_OR_RETURN(out.plan, PlanOfRound(round));
  out.rank = static_cast<int>(round.rank());
  if (out.plan.dst_shard_bytes[out.rank] > max_shard_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("source_layout: destination rank ", out.rank, "'s shard is ",
                                                   out.plan.dst_shard_bytes[out.rank], " bytes; at most ",
                                                   max_shard_bytes, " here"));
  }
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(transport::MemoryHandle shard, Shard(out.plan.dst_shard_bytes[out.rank]));
  out.allocate = absl::Now() - start;

  auto connect = [&](const std::string& address, const std::string& field) -> absl::StatusOr<transport::PeerId> {
    absl::StatusOr<transport::PeerId> peer = transport_.Connect(address);
    if (!peer.ok()) return common::Annotate(peer.status(), field);
    return peer;
  };
  DestinationRole role;
  role.rank = out.rank;
  role.shard = shard;
  if (!round.relay_from().empty()) {
    ASSIGN_OR_RETURN(role.relay_from, connect(round.relay_from(), "relay_from"));
  } else {
    for (int s = 0; s < round.source_addresses_size(); ++s) {
      ASSIGN_OR_RETURN(transport::PeerId peer,
                       connect(round.source_addresses(s), absl::StrCat("source_addresses[", s, "]")));
      role.src_peers.push_back(peer);
    }
  }
  if (!round.forward_to().empty()) {
    ASSIGN_OR_RETURN(role.forward_to, connect(round.forward_to(), "forward_to"));
  }
  ExecutorOptions options;
  if (round.chunk_bytes() > 0) options.chunk_bytes = round.chunk_bytes();
  options.map_peer_memory = round.map_peer_memory();
  options.tag_epoch = static_cast<int>(round.tag_epoch());
  options.timeout =
      std::min(round.round_timeout_ms() > 0 ? absl::Milliseconds(round.round_timeout_ms()) : absl::Seconds(10),
               std::max(deadline - absl::Now(), absl::Milliseconds(1)));
  options.deadline = deadline;
  options.digests = false;  // (a destination's own; the sources' shares come with the round)
  options.staging_pool = &pool_;
  const absl::Time transfer_start = absl::Now();
  absl::StatusOr<ExecutionStats> stats = Execute(transport_, out.plan, nullptr, &role, *ops_, options);
  if (!stats.ok()) {
    return common::Annotate(stats.status(), absl::StrCat("receiving destination rank ", out.rank, "'s shard"));
  }
  out.stats = *stats;
  out.transfer = absl::Now() - transfer_start;

  const absl::Time verify_start = absl::Now();
  out.shard = static_cast<const uint8_t*>(shard.base);
  void* copy_to = nullptr;
  if (round.map_peer_memory()) {  // (peers may still hold a mapping of the shard: see Receive)
    private_ = common::ReuseOrNewHugeString(std::move(private_), out.plan.dst_shard_bytes[out.rank]);
    copy_to = private_.data();
  }
  RETURN_IF_ERROR(VerifyDigest(out.plan, out.rank, out.shard, *ops_,
                               {round.digest_shares().begin(), round.digest_shares().end()}, copy_to));
  if (copy_to != nullptr) {
    out.shard = static_cast<const uint8_t*>(copy_to);
    out.private_copy = true;
  }
  out.verify = absl::Now() - verify_start;
  for (size_t t = 0; t < out.plan.tensors.size(); ++t) out.bytes_received += out.Part(t).size();
  return out;
}

}  // namespace rlfleet::reshard

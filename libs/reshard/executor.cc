#include "libs/reshard/executor.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/common/status_macros.h"
#include "libs/reshard/cast.h"
#include "libs/reshard/digest.h"
#include "libs/reshard/executor_internal.h"

namespace rlfleet::reshard {
namespace {

using internal::AddReceivedDigest;
using internal::kHelloIndex;
using internal::kTagEpochBits;
using internal::kTagIndexBits;
using internal::kTagRankBits;
using internal::MappedRun;
using internal::Pair;
using internal::TagOf;
using transport::Completion;
using transport::MemoryHandle;
using transport::PeerId;
using transport::Transport;

class HostMemoryOps : public MemoryOps {
 public:
  transport::MemoryKind kind() const override { return transport::MemoryKind::kHost; }
  void Copy(void* dst, const void* src, uint64_t bytes) override { std::memcpy(dst, src, bytes); }
  void CastF32ToBf16(void* dst, const void* src, uint64_t count) override { reshard::CastF32ToBf16(dst, src, count); }
  void ResetDigests(int slots) override { digests_.assign(slots, 0); }
  void AddDigest(int slot, const void* data, uint64_t bytes, uint64_t shard_offset) override {
    digests_[slot] += DigestBytes(data, bytes, shard_offset);
  }
  void CopyAndDigest(int slot, void* dst, const void* src, uint64_t bytes, uint64_t shard_offset) override {
    digests_[slot] += reshard::CopyAndDigest(dst, src, bytes, shard_offset);
  }
  absl::StatusOr<std::vector<uint64_t>> Digests() override { return digests_; }
  absl::Status Sync() override { return absl::OkStatus(); }

 private:
  std::vector<uint64_t> digests_;
};

// A submitted round, and what to unpack when it completes.
struct Round {
  uint64_t index = 0;
  std::unique_ptr<Completion> done;
  std::vector<std::pair<const Message*, uint64_t>> unpack;  // message, staging offset
  std::vector<const Message*> received;                     // (verify_received: digested once it arrived)
  // What a relay passes on once the round arrived: same tags, same bytes.
  std::vector<transport::Transport::TwoSidedOp> forward;
};

// A relay's forwards of one round, in flight.
struct Forward {
  uint64_t index = 0;
  std::unique_ptr<Completion> done;
};

absl::Status CheckRoles(const Plan& plan, const SourceRole* source, const DestinationRole* destination) {
  if (source == nullptr && destination == nullptr) {
    return absl::InvalidArgumentError("Execute: neither a source nor a destination role");
  }
  if (source != nullptr) {
    if (source->rank < 0 || source->rank >= plan.src.ranks) {
      return absl::InvalidArgumentError(
          absl::StrCat("source rank ", source->rank, " is not in [0, ", plan.src.ranks, ")"));
    }
    if (source->dst_peers.size() != static_cast<size_t>(plan.dst.ranks)) {
      return absl::InvalidArgumentError(absl::StrCat("source role has ", source->dst_peers.size(),
                                                     " destination peers; the plan has ", plan.dst.ranks,
                                                     " destination ranks"));
    }
    if (source->shard.length < plan.src_shard_bytes[source->rank]) {
      return absl::InvalidArgumentError(absl::StrCat("source rank ", source->rank, "'s shard is ", source->shard.length,
                                                     " bytes; the plan needs ", plan.src_shard_bytes[source->rank]));
    }
  }
  if (destination != nullptr) {
    if (destination->rank < 0 || destination->rank >= plan.dst.ranks) {
      return absl::InvalidArgumentError(
          absl::StrCat("destination rank ", destination->rank, " is not in [0, ", plan.dst.ranks, ")"));
    }
    if (destination->relay_from == 0 && destination->src_peers.size() != static_cast<size_t>(plan.src.ranks)) {
      return absl::InvalidArgumentError(absl::StrCat("destination role has ", destination->src_peers.size(),
                                                     " source peers; the plan has ", plan.src.ranks, " source ranks"));
    }
    if (destination->shard.length < plan.dst_shard_bytes[destination->rank]) {
      return absl::InvalidArgumentError(absl::StrCat("destination rank ", destination->rank, "'s shard is ",
                                                     destination->shard.length, " bytes; the plan needs ",
                                                     plan.dst_shard_bytes[destination->rank]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<MemoryOps> NewHostMemoryOps() { return std::make_unique<HostMemoryOps>(); }

StagingPool::~StagingPool() {
  mappings_.clear();
  if (handle_.id != 0) transport_.DeregisterMemory(handle_).IgnoreError();
  if (control_.id != 0) transport_.DeregisterMemory(control_).IgnoreError();
}

absl::StatusOr<MemoryHandle> StagingPool::Reuse(MemoryHandle& handle, uint64_t bytes, transport::MemoryKind kind,
                                                int device) {
  if (handle.id != 0 && handle.length >= bytes && handle.kind == kind && handle.device == device) {
    return handle;
  }
  if (handle.id != 0) {
    RETURN_IF_ERROR(transport_.DeregisterMemory(handle));
    handle = MemoryHandle();
  }
  ASSIGN_OR_RETURN(handle, transport_.AllocateMemory(bytes, kind, device));
  return handle;
}

absl::StatusOr<MemoryHandle> StagingPool::Get(uint64_t bytes, transport::MemoryKind kind, int device) {
  return Reuse(handle_, bytes, kind, device);
}

absl::StatusOr<MemoryHandle> StagingPool::GetControl(uint64_t bytes) {
  return Reuse(control_, bytes, transport::MemoryKind::kHost, 0);
}

absl::StatusOr<transport::RemoteMapping*> StagingPool::Map(PeerId peer, const v1::RemoteMemoryDescriptor& remote) {
  for (const Mapped& m : mappings_) {
    if (m.peer == peer && m.registration == remote.registration_id() && m.base == remote.base_address() &&
        m.length == remote.length_bytes() && m.epoch == remote.registration_epoch()) {
      return m.mapping.get();
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<transport::RemoteMapping> mapping, transport_.MapRemote(peer, remote));
  if (mappings_.size() == kMaxMappings) mappings_.pop_front();
  mappings_.push_back({peer, remote.registration_id(), remote.base_address(), remote.length_bytes(),
                       remote.registration_epoch(), std::move(mapping)});
  return mappings_.back().mapping.get();
}

std::vector<Message> CutMessages(const std::vector<Range>& ranges, uint64_t chunk_bytes, uint64_t direct_min_bytes) {
  std::vector<Message> out;
  auto adjacent = [](const Range& a, const Range& b) { return a.dst_offset + a.dst_bytes() == b.dst_offset; };
  auto emit = [&](Message& m) {
    if (m.pieces.empty()) return;
    m.direct = m.pieces.size() == 1 && !m.pieces[0].cast();
    m.dst_contiguous = true;
    for (size_t i = 1; i < m.pieces.size(); ++i) m.dst_contiguous &= adjacent(m.pieces[i - 1], m.pieces[i]);
    out.push_back(std::move(m));
    m = Message();
  };
  auto add = [&](Message& m, const Range& r) {
    if (!m.pieces.empty() && m.wire_bytes + r.dst_bytes() > chunk_bytes) emit(m);
    m.pieces.push_back(r);
    m.wire_bytes += r.dst_bytes();
  };
  // Splits `r` into chunk-sized messages of one piece each.
  auto split = [&](const Range& r) {
    const uint64_t per = std::max<uint64_t>(1, chunk_bytes / r.dst_elem);
    for (uint64_t e = 0; e < r.elements; e += per) {
      Range piece = r;
      piece.elements = std::min(per, r.elements - e);
      piece.src_offset = r.src_offset + e * r.src_elem;
      piece.dst_offset = r.dst_offset + e * r.dst_elem;
      Message m;
      add(m, piece);
      emit(m);
    }
  };
  auto big = [&](const Range& r) {
    return (!r.cast() && r.dst_bytes() >= direct_min_bytes) || r.dst_bytes() > chunk_bytes;
  };
  Message small;  // small pieces travelling together through staging
  for (size_t i = 0; i < ranges.size();) {
    if (big(ranges[i])) {  // worth a message of its own (no copy when uncast), in chunks
      split(ranges[i++]);
      continue;
    }
    size_t j = i + 1;  // the run [i, j) of small ranges end to end at the destination
    uint64_t run = ranges[i].dst_bytes();
    while (j < ranges.size() && !big(ranges[j]) && adjacent(ranges[j - 1], ranges[j])) run += ranges[j++].dst_bytes();
    if (run >= direct_min_bytes) {
      Message m;
      for (size_t k = i; k < j; ++k) add(m, ranges[k]);
      emit(m);
    } else {
      for (size_t k = i; k < j; ++k) add(small, ranges[k]);
    }
    i = j;
  }
  emit(small);
  return out;
}

absl::StatusOr<ExecutionStats> Execute(Transport& transport, const Plan& plan, const SourceRole* source,
                                       const DestinationRole* destination, MemoryOps& ops,
                                       const ExecutorOptions& options) {
  RETURN_IF_ERROR(CheckRoles(plan, source, destination));
  if (options.chunk_bytes < 8 || options.depth < 1) {
    return absl::InvalidArgumentError("Execute: chunk_bytes must be >= 8 and depth >= 1");
  }
  if (options.tag_epoch < 0 || options.tag_epoch >= (1 << kTagEpochBits)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Execute: tag_epoch ", options.tag_epoch, " is not in [0, ", 1 << kTagEpochBits, ")"));
  }
  if (plan.src.ranks > (1 << kTagRankBits)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Execute: ", plan.src.ranks, " source ranks; at most ", 1 << kTagRankBits));
  }
  const absl::Time start = absl::Now();
  ExecutionStats stats;

  std::vector<Pair> pairs;
  auto add_pair = [&](bool send, int peer_rank, int src_rank, PeerId peer, const std::vector<Range>& ranges) {
    Pair p{send, peer_rank, src_rank, peer, CutMessages(ranges, options.chunk_bytes, options.direct_min_bytes), {}};
    if (p.messages.empty()) return;
    // Rounds: consecutive messages up to chunk_bytes together (at least one).
    uint64_t in_round = 0;
    for (size_t m = 0; m < p.messages.size(); ++m) {
      if (m == 0 || in_round + p.messages[m].wire_bytes > options.chunk_bytes) {
        p.round_start.push_back(m);
        in_round = 0;
      }
      in_round += p.messages[m].wire_bytes;
    }
    p.round_start.push_back(p.messages.size());
    pairs.push_back(std::move(p));
  };
  if (source != nullptr) {
    for (int d = 0; d < plan.dst.ranks; ++d) {
      add_pair(true, d, source->rank, source->dst_peers[d], plan.Between(source->rank, d));
    }
  }
  if (destination != nullptr) {
    for (int s = 0; s < plan.src.ranks; ++s) {
      const PeerId from = destination->relay_from != 0 ? destination->relay_from : destination->src_peers[s];
      add_pair(false, s, s, from, plan.Between(s, destination->rank));
    }
  }
  uint64_t rounds = 0;
  uint64_t max_tag = 0;
  for (const Pair& p : pairs) {
    rounds = std::max<uint64_t>(rounds, p.rounds());
    if (p.messages.size() + p.rounds() + 2 >= (uint64_t{1} << kTagIndexBits)) {
      return absl::InvalidArgumentError(absl::StrCat("Execute: ", p.messages.size(), " messages between source ",
                                                     p.src_rank, " and its peer exceed 2^", kTagIndexBits,
                                                     "; raise chunk_bytes or direct_min_bytes"));
    }
    max_tag = std::max(max_tag, TagOf(options.tag_epoch, p.src_rank, p.messages.size()));
  }
  if (max_tag > transport.GetCapabilities().max_tag) {
    return absl::InvalidArgumentError(absl::StrCat("Execute: the plan needs message tags up to ", max_tag, "; the ",
                                                   transport.GetCapabilities().backend, " backend allows ",
                                                   transport.GetCapabilities().max_tag, " (too many source ranks)"));
  }
  stats.rounds = rounds;
  // Digest accumulators: the sources' shares in slots [0, dst ranks), what this rank
  // received in slot dst ranks.
  const bool verify = options.verify_received && destination != nullptr;
  if ((options.digests && source != nullptr) || verify) ops.ResetDigests(plan.dst.ranks + 1);
  auto finish = [&]() -> absl::StatusOr<ExecutionStats> {
    if ((options.digests && source != nullptr) || verify) {
      ASSIGN_OR_RETURN(std::vector<uint64_t> sums, ops.Digests());
      if (options.digests && source != nullptr) stats.digest_shares.assign(sums.begin(), sums.begin() + plan.dst.ranks);
      if (verify) stats.received_digest = sums[plan.dst.ranks];
    }
    stats.elapsed = absl::Now() - start;
    return stats;
  };

  // Same-host pairs first, through mappings; what remains goes as tagged messages.
  if (options.map_peer_memory && transport.GetCapabilities().maps_peer_memory && !pairs.empty() &&
      TagOf(options.tag_epoch, plan.src.ranks - 1, kHelloIndex) <= transport.GetCapabilities().max_tag) {
    MappedRun mapped(transport, plan, source, destination, ops, options, stats, pairs);
    MemoryHandle control;
    if (options.staging_pool != nullptr) {
      ASSIGN_OR_RETURN(control, options.staging_pool->GetControl(mapped.ControlBytes()));
    } else {
      ASSIGN_OR_RETURN(control, transport.AllocateMemory(mapped.ControlBytes(), transport::MemoryKind::kHost, 0));
    }
    absl::Cleanup free_control = [&] {
      if (options.staging_pool == nullptr) transport.DeregisterMemory(control).IgnoreError();
    };
    RETURN_IF_ERROR(mapped.Negotiate(control));
    RETURN_IF_ERROR(mapped.Run());
    pairs.erase(std::remove_if(pairs.begin(), pairs.end(), [](const Pair& p) { return p.mapped; }), pairs.end());
    rounds = 0;
    for (const Pair& p : pairs) rounds = std::max<uint64_t>(rounds, p.rounds());
    if (pairs.empty()) return finish();
  }

  // Staging: per round slot, room for the staged messages of that round.
  uint64_t slot_bytes = 0;
  for (uint64_t k = 0; k < rounds; ++k) {
    uint64_t need = 0;
    for (const Pair& p : pairs) {
      if (k >= p.rounds()) continue;
      for (size_t m = p.round_start[k]; m < p.round_start[k + 1]; ++m) {
        const Message& message = p.messages[m];
        const bool staged = p.send ? !message.direct : !(message.direct || message.dst_contiguous);
        if (staged) need += message.wire_bytes;
      }
    }
    slot_bytes = std::max(slot_bytes, need);
  }
  // A relay keeps a slot until its forward is done too: twice the slots.
  const bool relay = destination != nullptr && destination->forward_to != 0;
  const uint64_t slots = std::min<uint64_t>(options.depth * (relay ? 2 : 1), std::max<uint64_t>(rounds, 1));
  MemoryHandle staging;
  bool owned = false;
  if (slot_bytes > 0) {
    const int device = source != nullptr ? source->shard.device : destination->shard.device;
    auto allocated = options.staging_pool != nullptr ? options.staging_pool->Get(slot_bytes * slots, ops.kind(), device)
                                                     : transport.AllocateMemory(slot_bytes * slots, ops.kind(), device);
    if (!allocated.ok()) {
      return common::Annotate(allocated.status(), "allocating the resharding staging buffer");
    }
    staging = *allocated;
    owned = options.staging_pool == nullptr;
    stats.staging_bytes = slot_bytes * slots;
  }
  absl::Cleanup free_staging = [&] {
    if (owned) transport.DeregisterMemory(staging).IgnoreError();
  };
  const bool digests = options.digests && source != nullptr;

  auto* src_base = source != nullptr ? static_cast<uint8_t*>(source->shard.base) : nullptr;
  auto* dst_base = destination != nullptr ? static_cast<uint8_t*>(destination->shard.base) : nullptr;
  auto* stage_base = static_cast<uint8_t*>(staging.base);

  std::deque<Round> in_flight;
  std::deque<Forward> forwards;
  // Rounds still in flight when this returns early (it failed) have their receives
  // withdrawn: a later Execute with the same peers must not have its messages taken.
  absl::Cleanup withdraw = [&] {
    for (Round& r : in_flight) r.done->Cancel();
    for (Forward& f : forwards) f.done->Cancel();
  };
  auto finish_oldest = [&]() -> absl::Status {
    Round& round = in_flight.front();
    RETURN_IF_ERROR(
        internal::Await(*round.done, options, absl::StrCat("resharding round ", round.index, " of ", rounds)));
    for (const auto& [message, offset] : round.unpack) {
      uint64_t pos = 0;
      for (const Range& piece : message->pieces) {
        ops.Copy(dst_base + piece.dst_offset, stage_base + offset + pos, piece.dst_bytes());
        pos += piece.dst_bytes();
      }
    }
    if (!round.unpack.empty()) RETURN_IF_ERROR(ops.Sync());
    for (const Message* m : round.received) AddReceivedDigest(ops, plan.dst.ranks, dst_base, m->pieces);
    if (!round.forward.empty()) {
      for (const auto& op : round.forward) stats.bytes_forwarded += op.length;
      forwards.push_back({round.index, transport.SendRecvBatch(round.forward)});
    }
    in_flight.pop_front();
    return absl::OkStatus();
  };
  auto finish_forward = [&]() -> absl::Status {
    RETURN_IF_ERROR(
        internal::Await(*forwards.front().done, options,
                        absl::StrCat("forwarding resharding round ", forwards.front().index, " to the next replica")));
    forwards.pop_front();
    return absl::OkStatus();
  };

  const uint64_t window = std::min<uint64_t>(options.depth, slots);
  for (uint64_t k = 0; k < rounds; ++k) {
    if (in_flight.size() == window) RETURN_IF_ERROR(finish_oldest());
    // The slot this round takes must be free of an earlier round's forward.
    while (!forwards.empty() && forwards.front().index + slots <= k) RETURN_IF_ERROR(finish_forward());
    const uint64_t slot_base = (k % slots) * slot_bytes;
    uint64_t used = 0;
    bool packed = false;
    Round round;
    round.index = k;
    std::vector<Transport::TwoSidedOp> batch;
    // Digests of this round's bytes, issued after the round is submitted so that they
    // overlap its transfer (and never delay a pack's Sync).
    struct DigestTask {
      int slot;
      const uint8_t* data;
      uint64_t bytes;
      uint64_t shard_offset;
    };
    std::vector<DigestTask> digest_tasks;
    for (const Pair& p : pairs) {
      if (k >= p.rounds()) continue;
      for (size_t index = p.round_start[k]; index < p.round_start[k + 1]; ++index) {
        const Message& m = p.messages[index];
        Transport::TwoSidedOp op;
        op.send = p.send;
        op.peer = p.peer;
        op.tag = TagOf(options.tag_epoch, p.src_rank, index);
        op.length = m.wire_bytes;
        if (p.send) {
          stats.bytes_sent += m.wire_bytes;
          if (m.direct) {
            const Range& piece = m.pieces[0];
            op.memory = source->shard;
            op.offset = piece.src_offset;
            if (digests) {
              digest_tasks.push_back({p.peer_rank, src_base + piece.src_offset, m.wire_bytes, piece.dst_offset});
            }
          } else {
            op.memory = staging;
            op.offset = slot_base + used;
            uint64_t pos = op.offset;
            for (const Range& piece : m.pieces) {
              if (piece.cast()) {
                ops.CastF32ToBf16(stage_base + pos, src_base + piece.src_offset, piece.elements);
              } else {
                ops.Copy(stage_base + pos, src_base + piece.src_offset, piece.dst_bytes());
              }
              if (digests) {
                digest_tasks.push_back({p.peer_rank, stage_base + pos, piece.dst_bytes(), piece.dst_offset});
              }
              pos += piece.dst_bytes();
            }
            used += m.wire_bytes;
            packed = true;
            ++stats.staged_messages;
          }
        } else {
          stats.bytes_received += m.wire_bytes;
          if (verify) round.received.push_back(&m);
          if (m.direct || m.dst_contiguous) {
            op.memory = destination->shard;
            op.offset = m.pieces[0].dst_offset;
          } else {
            op.memory = staging;
            op.offset = slot_base + used;
            round.unpack.emplace_back(&m, op.offset);
            used += m.wire_bytes;
            ++stats.staged_messages;
          }
          if (relay) {
            Transport::TwoSidedOp forward = op;
            forward.send = true;
            forward.peer = destination->forward_to;
            round.forward.push_back(forward);
          }
        }
        ++stats.messages;
        batch.push_back(op);
      }
    }
    if (packed) RETURN_IF_ERROR(ops.Sync());
    round.done = transport.SendRecvBatch(batch);
    for (const DigestTask& t : digest_tasks) ops.AddDigest(t.slot, t.data, t.bytes, t.shard_offset);
    in_flight.push_back(std::move(round));
  }
  while (!in_flight.empty()) RETURN_IF_ERROR(finish_oldest());
  while (!forwards.empty()) RETURN_IF_ERROR(finish_forward());
  return finish();
}

absl::StatusOr<uint64_t> ShardDigest(const Plan& plan, int rank, const void* shard, MemoryOps& ops, void* copy_to) {
  if (rank < 0 || rank >= plan.dst.ranks) {
    return absl::InvalidArgumentError(absl::StrCat("destination rank ", rank, " is not in [0, ", plan.dst.ranks, ")"));
  }
  ops.ResetDigests(1);
  const auto* base = static_cast<const uint8_t*>(shard);
  for (const ShardPart& part : plan.dst_parts[rank]) {
    const uint64_t bytes = part.elements * DTypeSize(part.dtype);
    if (bytes == 0) continue;
    if (copy_to != nullptr) {
      ops.CopyAndDigest(0, static_cast<uint8_t*>(copy_to) + part.offset, base + part.offset, bytes, part.offset);
    } else {
      ops.AddDigest(0, base + part.offset, bytes, part.offset);
    }
  }
  ASSIGN_OR_RETURN(std::vector<uint64_t> sums, ops.Digests());
  return sums[0];
}

absl::Status VerifyDigest(const Plan& plan, int rank, const void* shard, MemoryOps& ops,
                          const std::vector<uint64_t>& shares_from_sources, void* copy_to) {
  ASSIGN_OR_RETURN(uint64_t got, ShardDigest(plan, rank, shard, ops, copy_to));
  uint64_t want = 0;
  for (uint64_t share : shares_from_sources) want += share;
  if (got != want) {
    return absl::DataLossError(absl::StrCat("destination rank ", rank, ": shard digest ", absl::Hex(got),
                                            " != ", absl::Hex(want), ", the sum of the sources' shares"));
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::reshard

// The resharding executor's internals, shared by executor.cc (the tagged path) and
// mapped_run.cc (the same-host path). Not an API: include only from those two.
#ifndef RLFLEET_LIBS_RESHARD_EXECUTOR_INTERNAL_H_
#define RLFLEET_LIBS_RESHARD_EXECUTOR_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "libs/common/status_macros.h"
#include "libs/reshard/executor.h"

namespace rlfleet::reshard::internal {

using transport::Completion;
using transport::PeerId;
using transport::Transport;

// One (source, destination) pair this process takes part in.
struct Pair {
  bool send = true;
  int peer_rank = 0;  // the other side's rank in its layout
  int src_rank = 0;   // the plan's source rank of this pair (tags)
  PeerId peer = 0;
  std::vector<Message> messages;
  // Round r is messages [round_start[r], round_start[r + 1]).
  std::vector<size_t> round_start;
  uint64_t rounds() const { return round_start.empty() ? 0 : round_start.size() - 1; }
  // Mapped path: the bytes go through a mapping of the destination's shard (a sender
  // holds it; a relay's forwards of this pair are mapped too).
  bool mapped = false;
  transport::RemoteMapping* mapping = nullptr;
};

// Tags fit the smallest tag space we know (UCX: 32 bits): 4 bits of the call's epoch
// (ExecutorOptions.tag_epoch: messages a failed call left behind never match the next
// one's), 8 of source rank, 20 of message index.
constexpr int kTagIndexBits = 20;
constexpr int kTagRankBits = 8;
constexpr int kTagEpochBits = 4;
inline uint64_t TagOf(int epoch, int src_rank, size_t index) {
  return (static_cast<uint64_t>(epoch) << (kTagIndexBits + kTagRankBits)) |
         (static_cast<uint64_t>(src_rank) << kTagIndexBits) | index;
}
// The mapped path's control messages take indices from the top of the space: a hello
// (the destination's shard descriptor, going up), the sender's answer, and one notice
// per round.
constexpr uint64_t kHelloIndex = (uint64_t{1} << kTagIndexBits) - 1;
constexpr uint64_t kAnswerIndex = kHelloIndex - 1;
inline uint64_t NoticeIndex(uint64_t round) { return kAnswerIndex - 1 - round; }

// Waits for `c` at most the per-round timeout and never past the call's deadline.
inline absl::Status Await(Completion& c, const ExecutorOptions& options, const std::string& what) {
  const absl::Duration left = options.deadline - absl::Now();
  absl::Status s = c.Wait(std::max(absl::ZeroDuration(), std::min(options.timeout, left)));
  return s.ok() ? s : common::Annotate(s, what);
}

// Calls fn(dst_offset, bytes) once per run of `pieces` that lie end to end at the
// destination (one copy or digest per run instead of per piece).
template <typename Fn>
void ForEachDestinationRun(const std::vector<Range>& pieces, Fn fn) {
  for (size_t a = 0; a < pieces.size();) {
    uint64_t bytes = pieces[a].dst_bytes();
    size_t b = a + 1;
    for (; b < pieces.size() && pieces[b].dst_offset == pieces[a].dst_offset + bytes; ++b)
      bytes += pieces[b].dst_bytes();
    if (bytes > 0) fn(pieces[a].dst_offset, bytes);
    a = b;
  }
}

// Adds the digest of what `pieces` delivered into the destination shard at `dst_base`
// to accumulator `slot`.
inline void AddReceivedDigest(MemoryOps& ops, int slot, const uint8_t* dst_base, const std::vector<Range>& pieces) {
  ForEachDestinationRun(
      pieces, [&](uint64_t offset, uint64_t bytes) { ops.AddDigest(slot, dst_base + offset, bytes, offset); });
}

// The mapped path of one Execute (mapped_run.cc): negotiation, then the copies and
// notices. The pairs it maps are marked `mapped`; Execute runs the rest tagged.
class MappedRun {
 public:
  MappedRun(Transport& transport, const Plan& plan, const SourceRole* source, const DestinationRole* destination,
            MemoryOps& ops, const ExecutorOptions& options, ExecutionStats& stats, std::vector<Pair>& pairs);
  // Host memory the run needs for its control messages.
  uint64_t ControlBytes() const;
  // Decides per pair whether it is mapped. Hellos go up (a relay sends its own once it
  // knows whether it can map the next replica), answers come down.
  absl::Status Negotiate(const transport::MemoryHandle& control);
  // Moves every mapped pair's bytes (see mapped_run.cc).
  absl::Status Run();

 private:
  uint64_t SendLink(size_t k) const;
  uint64_t RecvLink(size_t j) const;
  uint64_t ForwardLink(size_t j) const;
  absl::StatusOr<bool> ParseHello(Completion& c, uint64_t offset, v1::RemoteMemoryDescriptor* d);
  absl::StatusOr<transport::RemoteMapping*> Map(PeerId peer, const v1::RemoteMemoryDescriptor& d);

  Transport& t_;
  const Plan& plan_;
  const SourceRole* source_;
  const DestinationRole* destination_;
  MemoryOps& ops_;
  const ExecutorOptions& options_;
  ExecutionStats& stats_;
  std::vector<Pair>& pairs_;
  std::vector<size_t> sends_, recvs_;  // indices into pairs_
  bool forward_ = false;
  uint64_t rounds_ = 0;
  transport::MemoryHandle control_;
  uint8_t* base_ = nullptr;
  transport::RemoteMapping* forward_mapping_ = nullptr;  // the next replica's shard
  std::vector<std::unique_ptr<transport::RemoteMapping>> owned_;
};

}  // namespace rlfleet::reshard::internal

#endif  // RLFLEET_LIBS_RESHARD_EXECUTOR_INTERNAL_H_

// The resharding executor: runs this process's part of a Plan over a Transport.
//
// What moves. For every (source rank, destination rank) pair, the plan's ranges are cut
// into messages of at most chunk_bytes wire bytes (destination dtype). An uncast range
// of at least direct_min_bytes goes straight from the source shard to the destination
// shard (zero copy: FSDP -> TP rows is almost all such messages); smaller or cast
// ranges are packed (cast f32 -> bf16 on the way) into a staging slot by the sender and
// unpacked by the receiver. Both sides derive the same messages from the plan, so
// nothing but bytes travels.
//
// Same host. Where both ends of a pair can (MapRemote), the pair is mapped: the
// destination sends its shard's descriptor up (a relay once it knows its own forward
// maps), the sender maps it and answers, and then stores every message straight into
// the destination's shard, computing its digest share in the same pass (column splits
// are gathered there: no staging, no second copy) and sending a small notice per round.
// A relay forwards each round to the next replica's mapping as its notice arrives.
// Mapped pairs run first, then the tagged ones (neither waits on the other).
//
// Pipeline. Messages go in rounds: round k holds, for every pair this process takes
// part in, its next messages up to chunk_bytes, all submitted as one SendRecvBatch (one
// NCCL group); a message's tag is (source rank << 24) | its index in its pair. Up to
// `depth` rounds are in flight; staging is depth x (staged bytes per round) <= depth x
// pairs x chunk_bytes (twice that for a relay, whose slots also wait for the forward),
// so no rank ever holds more than that beyond its own shard: nobody materialises a
// whole tensor it does not own.
//
// Integrity. A source computes, per destination, its share of that destination's shard
// digest (libs/reshard/digest.h) over the bytes it sends; the destination's own digest
// of what it received must equal the sum of the shares (VerifyDigest). The shares travel
// through the control plane (the weights service), not here.
//
// Errors: every round's wait has options.timeout; a dead peer is the transport's
// UNAVAILABLE, a stall DEADLINE_EXCEEDED, each annotated with the round and the peer.
#ifndef RLFLEET_LIBS_RESHARD_EXECUTOR_H_
#define RLFLEET_LIBS_RESHARD_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/reshard/plan.h"
#include "libs/transport/transport.h"

namespace rlfleet::reshard {

// Copies, casts and digests where the shard memory lives (host, or a CUDA device).
// Copies may be asynchronous; Sync() waits for all of them.
class MemoryOps {
 public:
  virtual ~MemoryOps() = default;
  virtual transport::MemoryKind kind() const = 0;
  virtual void Copy(void* dst, const void* src, uint64_t bytes) = 0;
  virtual void CastF32ToBf16(void* dst, const void* src, uint64_t count) = 0;
  // Adds the digest share of [data, +bytes) at shard offset `shard_offset` to
  // accumulator `slot` (0 <= slot < slots given to ResetDigests).
  virtual void ResetDigests(int slots) = 0;
  virtual void AddDigest(int slot, const void* data, uint64_t bytes, uint64_t shard_offset) = 0;
  // Copy, and AddDigest of the bytes copied; the host does both in one pass.
  virtual void CopyAndDigest(int slot, void* dst, const void* src, uint64_t bytes, uint64_t shard_offset) {
    Copy(dst, src, bytes);
    AddDigest(slot, dst, bytes, shard_offset);
  }
  // Waits for queued work; then the accumulators.
  virtual absl::StatusOr<std::vector<uint64_t>> Digests() = 0;
  virtual absl::Status Sync() = 0;
};

// Host memory: memcpy, the scalar cast, the scalar digest.
std::unique_ptr<MemoryOps> NewHostMemoryOps();

// Staging memory kept across Execute calls, so that syncing every new weight version
// does not allocate, map and fault in fresh pages each time. Grows when a plan needs
// more. One Execute at a time per pool; must not outlive its transport.
class StagingPool {
 public:
  explicit StagingPool(transport::Transport& transport) : transport_(transport) {}
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  // A registration of at least `bytes` bytes of `kind` memory on `device`.
  absl::StatusOr<transport::MemoryHandle> Get(uint64_t bytes, transport::MemoryKind kind, int device);
  // Host memory for the executor's control messages (mapped path), likewise kept.
  absl::StatusOr<transport::MemoryHandle> GetControl(uint64_t bytes);
  // The mapping of a peer's registration, kept too: mapping afresh each sync would
  // page-fault every page of the destination's shard again. The pool keeps the last
  // kMaxMappings.
  absl::StatusOr<transport::RemoteMapping*> Map(transport::PeerId peer, const v1::RemoteMemoryDescriptor& remote);
  static constexpr size_t kMaxMappings = 16;

 private:
  absl::StatusOr<transport::MemoryHandle> Reuse(transport::MemoryHandle& handle, uint64_t bytes,
                                                transport::MemoryKind kind, int device);
  transport::Transport& transport_;
  transport::MemoryHandle handle_;
  transport::MemoryHandle control_;
  struct Mapped {
    transport::PeerId peer;
    uint64_t registration, base, length, epoch;
    std::unique_ptr<transport::RemoteMapping> mapping;
  };
  std::deque<Mapped> mappings_;  // most recently made last
};

struct ExecutorOptions {
  // Most wire bytes per pair per round, and the largest message.
  uint64_t chunk_bytes = 16ull << 20;
  // An uncast range this large is sent in place, not copied through staging.
  uint64_t direct_min_bytes = 256ull << 10;
  int depth = 4;
  absl::Duration timeout = absl::Seconds(60);    // per round
  absl::Time deadline = absl::InfiniteFuture();  // for the whole call
  bool digests = true;                           // compute the sources' digest shares
  // Where a pair's two ends share a host (Transport::MapRemote), the sender stores the
  // bytes straight into the destination's shard (the digest in the same pass; column
  // splits gathered on the way, no staging) and signals each round with a small
  // message; other pairs use tagged messages. Every rank of one Execute must agree.
  bool map_peer_memory = true;
  // A destination digests what it received as each round arrives (while later rounds
  // are in flight): ExecutionStats.received_digest, which must equal the sum of the
  // sources' shares (what VerifyDigest checks, without a second pass afterwards).
  bool verify_received = false;
  // 0..15, the same on every rank of one call, and different from the last call's
  // between the same processes (e.g. the weight version mod 16): a message that a call
  // which failed left behind (sent but never received) then never matches this one.
  int tag_epoch = 0;
  StagingPool* staging_pool = nullptr;  // null: allocate and free per call
};

// This process as a source rank: its shard (registered with the transport, plan
// .src_shard_bytes[rank] long) and a PeerId per destination rank.
struct SourceRole {
  int rank = -1;
  transport::MemoryHandle shard;
  std::vector<transport::PeerId> dst_peers;
};
// This process as a destination rank: its shard and a PeerId per source rank.
//
// Relay (a chain of replicas with the same layout, so that the trainer ranks send each
// byte once): a destination with `forward_to` passes every message on to that peer as
// soon as its round arrived (the same bytes, from its shard or its staging slot); the
// next replica's rank sets `relay_from` to the forwarding peer instead of src_peers and
// receives exactly what the plan's sources would have sent it, so the digest shares
// check it too.
struct DestinationRole {
  int rank = -1;
  transport::MemoryHandle shard;
  std::vector<transport::PeerId> src_peers;  // one per source rank, unless relay_from
  transport::PeerId relay_from = 0;          // non-zero: everything comes from this peer
  transport::PeerId forward_to = 0;          // non-zero: forward everything to this peer
};

struct ExecutionStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_forwarded = 0;
  uint64_t messages = 0;         // sent + received
  uint64_t staged_messages = 0;  // that needed packing or unpacking
  uint64_t rounds = 0;
  uint64_t staging_bytes = 0;  // staging memory this process allocated
  uint64_t mapped_pairs = 0;   // pairs (and forwards) that moved through a mapping
  absl::Duration elapsed;
  // As a source: digest_shares[d] = this rank's share of destination d's digest.
  std::vector<uint64_t> digest_shares;
  // As a destination with verify_received: the digest of its shard as received.
  uint64_t received_digest = 0;
};

// Runs the part of `plan` that this process plays: as a source, a destination, or both
// (either may be null). INVALID_ARGUMENT for roles that do not fit the plan (rank out of
// range, a peer list of the wrong size, a shard smaller than the plan's).
absl::StatusOr<ExecutionStats> Execute(transport::Transport& transport, const Plan& plan, const SourceRole* source,
                                       const DestinationRole* destination, MemoryOps& ops,
                                       const ExecutorOptions& options = {});

// The digest of destination `rank`'s shard (its parts, not the padding) at `shard`.
// With `copy_to` (as long as the shard), each part is also copied there, at its own
// offset, in the same pass, and the digest is the copy's.
absl::StatusOr<uint64_t> ShardDigest(const Plan& plan, int rank, const void* shard, MemoryOps& ops,
                                     void* copy_to = nullptr);

// DATA_LOSS naming the destination when its digest differs from the sum of the shares.
// With `copy_to`: the copy is what is verified (ShardDigest), for a shard that peers can
// still store into (mapped); use the copy, not the shard.
absl::Status VerifyDigest(const Plan& plan, int rank, const void* shard, MemoryOps& ops,
                          const std::vector<uint64_t>& shares_from_sources, void* copy_to = nullptr);

// The messages of one (source, destination) pair, as both sides cut them.
struct Message {
  std::vector<Range> pieces;
  uint64_t wire_bytes = 0;
  bool direct = false;  // one uncast piece: no staging on either side
  // The pieces lie end to end in the destination shard, in order: the sender packs
  // them (and casts), the receiver takes the message straight into its shard.
  bool dst_contiguous = false;
};
// Uncast ranges of at least direct_min_bytes go straight (zero copy), in chunks. Runs
// of smaller (or cast) ranges that lie end to end at the destination and add up to
// direct_min_bytes (a column split's rows, from an FSDP source) become messages of
// their own that the receiver takes without unpacking. The rest is packed together
// into staged messages of <= chunk_bytes.
std::vector<Message> CutMessages(const std::vector<Range>& ranges, uint64_t chunk_bytes, uint64_t direct_min_bytes);

}  // namespace rlfleet::reshard

#endif  // RLFLEET_LIBS_RESHARD_EXECUTOR_H_

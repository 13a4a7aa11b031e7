// The data plane: one interface for moving bulk bytes (experience payloads, weight
// shards) between processes. gRPC carries descriptors; a Transport carries the bytes.
//
// Backends (each in its own folder, the only place its vendor SDK is included):
//   loopback/  in-process, for unit tests of everything above the transport
//   ucx/       UCX ucp: tcp, shared memory (sm, posix, cma), RDMA / CUDA where built in
//   nccl/      GPU to GPU (communicators from a unique id; grouped send/recv, broadcast)
//   fault/     a decorator over any backend that delays, drops, corrupts or fails
//
// Model. A process creates a Transport, publishes LocalAddress() through the control
// plane, and Connect()s to the peers whose addresses it learns. Memory is registered
// before it is used; a registration's Describe() is a v1::RemoteMemoryDescriptor that a
// peer can name in Put / Get. Every transfer returns a Completion; its Wait(timeout)
// never blocks longer than the timeout, and a dead peer turns into an error (UNAVAILABLE)
// rather than a hang.
//
// Errors (from Wait, or at once from a submission that cannot start):
//   INVALID_ARGUMENT     malformed descriptor or remote key, zero-length region, wrong backend
//   PERMISSION_DENIED    a descriptor without a valid MAC, or expired (AuthenticatedTransport)
//   OUT_OF_RANGE         offset + length outside the local or remote registration
//   NOT_FOUND            unknown peer id or local registration (e.g. deregistered)
//   FAILED_PRECONDITION  stale remote key: the owner deregistered it or restarted
//   UNIMPLEMENTED        an operation the backend does not offer (see Capabilities)
//   UNAVAILABLE          the peer died or the connection broke
//   DEADLINE_EXCEEDED    Wait's timeout passed (the transfer may still finish later)
//   DATA_LOSS            a receive was larger than the posted buffer (truncated)
//
// Memory ownership: registered memory must stay valid until it is deregistered, and a
// buffer named in a transfer must stay valid until that transfer's Completion is done
// (Wait returned anything but DEADLINE_EXCEEDED) or the Transport is destroyed.
#ifndef RLFLEET_LIBS_TRANSPORT_TRANSPORT_H_
#define RLFLEET_LIBS_TRANSPORT_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rlfleet/v1/common.pb.h"

namespace rlfleet::transport {

enum class MemoryKind { kHost, kCuda };

struct Capabilities {
  std::string backend;       // "loopback", "ucx", "nccl", "fault(<inner>)"
  bool host_memory = false;  // can register host memory
  bool cuda_memory = false;  // can register CUDA device memory
  bool one_sided = false;    // Put / Get offered
  bool two_sided = false;    // Send / Recv offered
  // False when one-sided operations are emulated slowly (UCX 1.13 over tcp): bulk
  // transfers should then go through Send / Recv.
  bool one_sided_fast = false;
  // MapRemote can map a same-host peer's memory (UCX with a shared-memory transport).
  bool maps_peer_memory = false;
  uint64_t max_message_bytes = 0;   // largest single transfer
  uint64_t max_tag = ~uint64_t{0};  // largest Send / Recv tag (UCX: 2^32 - 1)
  std::string detail;               // backend specifics, e.g. the UCX transports in use
};

// A local registration. Copyable value; the registration itself lives in the Transport
// until DeregisterMemory.
struct MemoryHandle {
  uint64_t id = 0;  // unique per Transport; 0 is never a valid registration
  void* base = nullptr;
  uint64_t length = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;  // CUDA ordinal for kCuda
};

using PeerId = uint64_t;

// The result of one submitted transfer. Thread-safe.
class Completion {
 public:
  virtual ~Completion() = default;
  // Blocks until the transfer finishes or `timeout` passes. Returns the transfer's
  // status, or DEADLINE_EXCEEDED (the transfer stays pending; Wait may be called again).
  virtual absl::Status Wait(absl::Duration timeout) = 0;
  // True once the transfer has finished (successfully or not).
  virtual bool Done() = 0;
  // Bytes moved; for Recv, the size of the message received. Valid once Done().
  virtual uint64_t bytes() = 0;
  // Withdraws an unfinished Recv, so that a later Send under its tag is not taken by it
  // (it finishes CANCELLED): for a caller that gives up on a transfer and will talk to
  // the same peer again. Sends, Puts and Gets in flight cannot be withdrawn and run on;
  // nor can NCCL operations. No effect on a finished operation.
  virtual void Cancel() {}
};

// A peer's registration mapped into this process (Transport::MapRemote): plain loads
// and stores reach the peer's memory. Destroy it before its transport.
class RemoteMapping {
 public:
  virtual ~RemoteMapping() = default;
  virtual uint8_t* data() const = 0;  // the registration's first byte
  virtual uint64_t length() const = 0;
};

// Thread-safe: every method may be called from any thread.
class Transport {
 public:
  virtual ~Transport() = default;

  virtual Capabilities GetCapabilities() const = 0;

  // Opaque bytes a peer passes to Connect() (carried in v1::Endpoint.worker_address).
  virtual std::string LocalAddress() const = 0;

  // Connects to a peer by its LocalAddress(). Idempotent per address: connecting twice
  // returns the same id. INVALID_ARGUMENT for a malformed address; UNAVAILABLE if the
  // peer cannot be reached.
  virtual absl::StatusOr<PeerId> Connect(absl::string_view peer_address) = 0;

  // Gives up on `peer`'s connection: its operations in flight fail UNAVAILABLE (naming
  // `why`) and the next Connect to its address makes a fresh connection. For a peer
  // that answers through a connection a partition left behind (tcp's retransmissions
  // back off to two minutes while a link is down, and a message queued behind them
  // arrives that late after it heals). A transport without connections ignores it.
  virtual void Disconnect(PeerId /*peer*/, const absl::Status& /*why*/) {}

  // Registers [base, base + length) for transfers. INVALID_ARGUMENT for a null base,
  // zero length or an unsupported memory kind.
  virtual absl::StatusOr<MemoryHandle> RegisterMemory(void* base, uint64_t length, MemoryKind kind = MemoryKind::kHost,
                                                      int device = 0) = 0;
  // Allocates `length` bytes in the way this backend serves best and registers them
  // (UCX: memory peers on this host map directly, so their Put / Get are a plain
  // memcpy; NCCL: device memory). Its contents are unspecified. DeregisterMemory frees it. INVALID_ARGUMENT for zero
  // length; RESOURCE_EXHAUSTED when the allocation fails.
  virtual absl::StatusOr<MemoryHandle> AllocateMemory(uint64_t length, MemoryKind kind = MemoryKind::kHost,
                                                      int device = 0) = 0;

  // Releases a registration (and frees the memory if AllocateMemory made it). Peers
  // that use its descriptor afterwards get FAILED_PRECONDITION (or, where the backend
  // cannot tell, an error from the hardware). NOT_FOUND if it is not registered.
  virtual absl::Status DeregisterMemory(const MemoryHandle& handle) = 0;

  // The descriptor a peer needs to Put into / Get from this registration.
  // NOT_FOUND if it is not registered.
  virtual absl::StatusOr<v1::RemoteMemoryDescriptor> Describe(const MemoryHandle& handle) = 0;

  // One-sided: writes local[local_offset, +length) to the peer's registration `remote`
  // at remote_offset. Completes when the bytes are in the peer's memory.
  virtual std::unique_ptr<Completion> Put(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                          const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                          uint64_t length) = 0;
  // One one-sided write of a batch (see PutBatch). `remote` must stay valid during the
  // PutBatch call.
  struct PutOp {
    MemoryHandle local;
    uint64_t local_offset = 0;
    const v1::RemoteMemoryDescriptor* remote = nullptr;
    uint64_t remote_offset = 0;
    uint64_t length = 0;
  };
  // Puts every op to `peer`; completes once all of them are in the peer's memory, with
  // the first error if any failed. Backends that need a remote-completion round per
  // Put (UCX: an endpoint flush) do one for the whole batch, so many chunks cost one
  // round trip. The default issues the Puts one by one.
  virtual std::unique_ptr<Completion> PutBatch(PeerId peer, const std::vector<PutOp>& ops);

  // One-sided: reads the peer's remote[remote_offset, +length) into local at local_offset.
  virtual std::unique_ptr<Completion> Get(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                          const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                          uint64_t length) = 0;

  // Two-sided: sends local[offset, +length) to `peer` under `tag`; matched in order
  // with the peer's Recv(this process's PeerId there, tag).
  virtual std::unique_ptr<Completion> Send(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                           uint64_t length) = 0;
  // Receives one message from `peer` under `tag` into local[offset, +capacity).
  // DATA_LOSS if the message was larger than capacity.
  virtual std::unique_ptr<Completion> Recv(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                           uint64_t capacity) = 0;

  // Maps the peer's registration `remote` into this process, where the backend can: UCX
  // for a peer on this host whose memory came from its AllocateMemory, over a
  // shared-memory transport (ucp_rkey_ptr); loopback (one process). Stores through the
  // mapping are ordered with a later Send only by the CPU's memory model: fence
  // (std::atomic_thread_fence) before telling the peer. The memory stays mapped until
  // the mapping is destroyed; stores after the owner deregistered it reach memory that
  // nobody reads. UNIMPLEMENTED where it cannot map (another host, device memory, no
  // shared-memory transport); the caller then moves bytes with Send / Recv or Put / Get.
  virtual absl::StatusOr<std::unique_ptr<RemoteMapping>> MapRemote(PeerId peer,
                                                                   const v1::RemoteMemoryDescriptor& remote);

  // One Send (send = true) or Recv of a batch.
  struct TwoSidedOp {
    bool send = true;
    PeerId peer = 0;
    uint64_t tag = 0;
    MemoryHandle memory;
    uint64_t offset = 0;
    uint64_t length = 0;  // a Recv's capacity
  };
  // Submits every op together; completes once all completed, with the first error.
  // Backends that must issue matching sends and receives together to avoid deadlock
  // (NCCL: one ncclGroupStart / End) override it; the default submits them one by one.
  virtual std::unique_ptr<Completion> SendRecvBatch(const std::vector<TwoSidedOp>& ops);
};

// A Completion that finishes when every one of `parts` has, with the first error.
std::unique_ptr<Completion> AllOf(std::vector<std::unique_ptr<Completion>> parts);

// A Completion that is already finished: for submissions rejected up front.
std::unique_ptr<Completion> CompletedWith(absl::Status status, uint64_t bytes = 0);

// A Completion finished later by whoever holds it (backends). Thread-safe.
class PendingCompletion : public Completion {
 public:
  absl::Status Wait(absl::Duration timeout) override;
  bool Done() override;
  uint64_t bytes() override;
  // Finishes it; later calls are ignored (the first status wins).
  void Finish(absl::Status status, uint64_t bytes);

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// A Completion that forwards to a PendingCompletion the backend also holds.
std::unique_ptr<Completion> Share(std::shared_ptr<PendingCompletion> pending);

// The backend under any decorators: "ucx" for "fault(authenticated(ucx))". Decorators
// name themselves "<decorator>(<inner backend>)" in Capabilities::backend.
std::string BaseBackend(const Capabilities& capabilities);

// Shared validation of a range against a region: OUT_OF_RANGE naming `what`.
absl::Status CheckRange(absl::string_view what, uint64_t offset, uint64_t length, uint64_t region_length);

}  // namespace rlfleet::transport

#endif  // RLFLEET_LIBS_TRANSPORT_TRANSPORT_H_

// NCCL backend: GPU to GPU between the ranks of one communicator. The only code that
// includes NCCL and CUDA runtime headers in libs/transport.
//
// A communicator is made by all its ranks together from one unique id that rank 0
// creates (NewUniqueId) and the control plane hands to the others; Create() blocks
// until every rank joined or the init timeout passed (then the communicator is
// aborted: a missing rank is DEADLINE_EXCEEDED, not a hang). Peers are ranks:
// Connect("nccl:<rank>") returns a PeerId for that rank.
//
// Send / Recv are ncclSend / ncclRecv on the transport's stream; NCCL has no tags, so
// messages between two ranks match in order, and a Recv's capacity must equal the
// message length (NCCL needs equal counts). Broadcast and Grouped (several sends and
// receives in one ncclGroupStart/End) are NCCL-specific extras. Put / Get are
// UNIMPLEMENTED. Only CUDA memory can be registered.
//
// Every operation has a deadline (NcclOptions::op_timeout): a watchdog aborts the
// communicator (ncclCommAbort) when one runs past it or NCCL reports an asynchronous
// error, and every pending and later operation then fails with UNAVAILABLE. A dead
// rank is thus an error within the deadline, never a hang.
//
// Thread-safe.
#ifndef RLFLEET_LIBS_TRANSPORT_NCCL_NCCL_TRANSPORT_H_
#define RLFLEET_LIBS_TRANSPORT_NCCL_NCCL_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/transport/transport.h"

namespace rlfleet::transport {

struct NcclOptions {
  std::string unique_id;  // NcclTransport::NewUniqueId() of rank 0, same bytes on every rank
  int world_size = 1;
  int rank = 0;
  int device = 0;  // CUDA device of this rank
  absl::Duration init_timeout = absl::Seconds(60);
  absl::Duration op_timeout = absl::Seconds(60);
  // CUDA stream (a cudaStream_t) to enqueue NCCL work on, e.g. the caller's compute
  // stream; not owned. Null: the transport creates its own.
  void* cuda_stream = nullptr;
};

class NcclTransport : public Transport {
 public:
  // A fresh communicator id (ncclGetUniqueId). FAILED_PRECONDITION without NCCL.
  static absl::StatusOr<std::string> NewUniqueId();

  // Joins the communicator. FAILED_PRECONDITION without a CUDA device; INVALID_ARGUMENT
  // for a bad id, rank or world size; DEADLINE_EXCEEDED if the other ranks did not join
  // within init_timeout (the communicator is aborted).
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(const NcclOptions& options);
  ~NcclTransport() override;

  int rank() const;
  int world_size() const;

  // Broadcasts `length` bytes from `root`'s send registration to every rank's receive
  // registration (they may be the same registration).
  std::unique_ptr<Completion> Broadcast(int root, const MemoryHandle& send, uint64_t send_offset,
                                        const MemoryHandle& recv, uint64_t recv_offset, uint64_t length);

  struct GroupedOp {
    bool send = true;
    PeerId peer = 0;
    MemoryHandle memory;
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  // Runs all `ops` inside one ncclGroupStart / ncclGroupEnd (so sends and receives
  // between the same ranks cannot deadlock each other); one Completion for all.
  std::unique_ptr<Completion> Grouped(const std::vector<GroupedOp>& ops);

  Capabilities GetCapabilities() const override;
  std::string LocalAddress() const override;
  absl::StatusOr<PeerId> Connect(absl::string_view peer_address) override;
  absl::StatusOr<MemoryHandle> RegisterMemory(void* base, uint64_t length, MemoryKind kind, int device) override;
  absl::StatusOr<MemoryHandle> AllocateMemory(uint64_t length, MemoryKind kind, int device) override;
  absl::Status DeregisterMemory(const MemoryHandle& handle) override;
  absl::StatusOr<v1::RemoteMemoryDescriptor> Describe(const MemoryHandle& handle) override;
  std::unique_ptr<Completion> Put(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                  const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                  uint64_t length) override;
  std::unique_ptr<Completion> Get(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                  const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                  uint64_t length) override;
  std::unique_ptr<Completion> Send(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                   uint64_t length) override;
  std::unique_ptr<Completion> Recv(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                   uint64_t capacity) override;
  // One NCCL group (tags are ignored, as for Send / Recv).
  std::unique_ptr<Completion> SendRecvBatch(const std::vector<TwoSidedOp>& ops) override;

  class Impl;

 private:
  explicit NcclTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlfleet::transport

#endif  // RLFLEET_LIBS_TRANSPORT_NCCL_NCCL_TRANSPORT_H_

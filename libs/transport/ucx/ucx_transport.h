// UCX (ucp) backend of the Transport interface. The only code that includes UCX
// headers (STYLE.md: one interface per vendor SDK).
//
// One ucp worker per UcxTransport (UCS_THREAD_MODE_SERIALIZED under one mutex). A
// thread that submits a transfer calls UCX itself, and a thread blocked in
// Completion::Wait drives the worker while it waits, so a transfer needs no hand-off
// between threads; a background progress thread drives it when nobody waits (for
// incoming messages and control traffic), spinning with sched_yield while transfers
// make progress and backing off to a 1 ms poll when idle.
// MapRemote maps a same-host peer's AllocateMemory region (ucp_rkey_ptr over posix /
// sysv / xpmem) for callers that move bytes with plain stores.
//
// Transports are UCX's own choice: UCX_TLS from the environment, or UcxOptions::tls.
// For local runs UCX_NET_DEVICES is pinned to loopback (`lo`) unless the environment
// sets it, so tcp never opens a lane on another interface.
//
// Addresses: LocalAddress() = "RLFUCX1" + instance id + ucp worker address. Connect()
// creates an endpoint (error mode PEER: a dead peer fails its transfers) and sends a
// hello, so the peer gets an endpoint back without calling Connect itself.
// Send / Recv use tag matching (tag = sender id << 32 | user tag; user tags < 2^32).
// Put = ucp_put_nbx + endpoint flush (completes when the bytes are remote); PutBatch
// issues many puts and one flush; Get = ucp_get_nbx. Remote keys are framed (owner instance, registration id, checksum)
// so a garbled or foreign key is INVALID_ARGUMENT before UCX sees it, and DeregisterMemory revokes the key at every
// connected peer (an active message, acknowledged once their transfers with it finished) before unmapping, so a stale
// key is FAILED_PRECONDITION.
//
// UCX 1.13 emulates RMA over tcp slowly (put ~0.03 GB/s): Capabilities reports
// one_sided_fast = false when tcp is the only non-self transport, and bulk transfers
// should then use Send / Recv.
//
// Thread-safe.
#ifndef RLFLEET_LIBS_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define RLFLEET_LIBS_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/transport/transport.h"

namespace rlfleet::transport {

struct UcxOptions {
  // UCX transports (UCX_TLS syntax, e.g. "tcp", "sm,self", "posix,cma,self").
  // Empty: the UCX_TLS environment variable, else UCX's default ("all").
  std::string tls;
  // Pin UCX_NET_DEVICES to `lo` when the environment does not set it.
  bool loopback_only = true;
  // Network devices UCX may use (UCX_NET_DEVICES syntax, e.g. "eth1" or "mlx5_0:1"):
  // the data plane listens and connects only there. Non-empty wins over loopback_only
  // and the environment. INVALID_ARGUMENT from Create() if UCX refuses the value.
  std::string net_devices;
  // The fleet's data-plane secret: when set, the backend's control messages (hello, key
  // revocation, its acknowledgement) carry an HMAC-SHA256 under it, and messages
  // without a valid one are dropped and counted (rejected_control_messages()), so that
  // a host on the network cannot forge an acknowledgement and make an owner free
  // memory a peer still writes. Empty: unauthenticated (a trusted network).
  std::string control_secret;
  // How often UCX checks that peers are alive (UCX_KEEPALIVE_INTERVAL).
  absl::Duration keepalive_interval = absl::Seconds(1);
  // How long DeregisterMemory waits for peers to acknowledge the revocation.
  absl::Duration revoke_timeout = absl::Seconds(5);
};

class UcxTransport : public Transport {
 public:
  // Creates the UCX context, worker and progress thread. UNAVAILABLE with UCX's
  // message if UCX cannot start with these transports.
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(const UcxOptions& options = {});
  ~UcxTransport() override;

  Capabilities GetCapabilities() const override;
  std::string LocalAddress() const override;
  absl::StatusOr<PeerId> Connect(absl::string_view peer_address) override;
  void Disconnect(PeerId peer, const absl::Status& why) override;
  absl::StatusOr<MemoryHandle> RegisterMemory(void* base, uint64_t length, MemoryKind kind, int device) override;
  absl::StatusOr<MemoryHandle> AllocateMemory(uint64_t length, MemoryKind kind, int device) override;
  absl::Status DeregisterMemory(const MemoryHandle& handle) override;
  absl::StatusOr<v1::RemoteMemoryDescriptor> Describe(const MemoryHandle& handle) override;
  std::unique_ptr<Completion> Put(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                  const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                  uint64_t length) override;
  std::unique_ptr<Completion> PutBatch(PeerId peer, const std::vector<PutOp>& ops) override;
  std::unique_ptr<Completion> Get(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                  const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                  uint64_t length) override;
  // Same-host peers' AllocateMemory regions, over posix / sysv / xpmem: ucp_rkey_ptr.
  absl::StatusOr<std::unique_ptr<RemoteMapping>> MapRemote(PeerId peer,
                                                           const v1::RemoteMemoryDescriptor& remote) override;
  std::unique_ptr<Completion> Send(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                   uint64_t length) override;
  std::unique_ptr<Completion> Recv(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                   uint64_t capacity) override;

  // Control messages dropped for a missing or wrong MAC (UcxOptions::control_secret).
  uint64_t rejected_control_messages() const;

  class Impl;  // the UCX state (ucx_transport.cc)

 private:
  explicit UcxTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlfleet::transport

#endif  // RLFLEET_LIBS_TRANSPORT_UCX_UCX_TRANSPORT_H_

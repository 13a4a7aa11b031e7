// In-process Transport for unit tests of everything above the data plane. Transports
// created on the same LoopbackFabric reach each other; Put / Get are memcpy into the
// owner's live registration (so stale keys are detected exactly), Send / Recv match
// per (sender, tag) in order with rendezvous semantics (a Send completes when a Recv
// took its bytes). Close() (or destruction) makes the transport a dead peer: its
// partners' pending transfers fail with UNAVAILABLE. Thread-safe.
#ifndef RLFLEET_LIBS_TRANSPORT_LOOPBACK_LOOPBACK_TRANSPORT_H_
#define RLFLEET_LIBS_TRANSPORT_LOOPBACK_LOOPBACK_TRANSPORT_H_

#include <deque>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "libs/transport/transport.h"

namespace rlfleet::transport {

class LoopbackFabric;

class LoopbackTransport : public Transport {
 public:
  // Creates a transport on `fabric` (the process-wide default when null).
  static std::unique_ptr<LoopbackTransport> Create(std::shared_ptr<LoopbackFabric> fabric = nullptr);
  ~LoopbackTransport() override;

  // Makes this transport a dead peer: fails every pending transfer that involves it.
  void Close();

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
  absl::StatusOr<std::unique_ptr<RemoteMapping>> MapRemote(PeerId peer,
                                                           const v1::RemoteMemoryDescriptor& remote) override;
  std::unique_ptr<Completion> Send(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                   uint64_t length) override;
  std::unique_ptr<Completion> Recv(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                   uint64_t capacity) override;

  struct Node;  // shared state of one transport (defined in the .cc)

 private:
  explicit LoopbackTransport(std::shared_ptr<LoopbackFabric> fabric, std::shared_ptr<Node> node);

  std::unique_ptr<Completion> OneSided(bool put, PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                       const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                       uint64_t length);

  const std::shared_ptr<LoopbackFabric> fabric_;
  const std::shared_ptr<Node> node_;
};

}  // namespace rlfleet::transport

#endif  // RLFLEET_LIBS_TRANSPORT_LOOPBACK_LOOPBACK_TRANSPORT_H_

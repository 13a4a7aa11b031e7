// A Transport that forwards every call to an inner one: the base of decorators
// (AuthenticatedTransport, FaultTransport), which override only what they change.
// Thread-safe as the inner transport is.
#ifndef RLFLEET_LIBS_TRANSPORT_FORWARDING_TRANSPORT_H_
#define RLFLEET_LIBS_TRANSPORT_FORWARDING_TRANSPORT_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "libs/transport/transport.h"

namespace rlfleet::transport {

class ForwardingTransport : public Transport {
 public:
  explicit ForwardingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}

  Transport* inner() { return inner_.get(); }

  Capabilities GetCapabilities() const override { return inner_->GetCapabilities(); }
  std::string LocalAddress() const override { return inner_->LocalAddress(); }
  absl::StatusOr<PeerId> Connect(absl::string_view a) override { return inner_->Connect(a); }
  void Disconnect(PeerId peer, const absl::Status& why) override { inner_->Disconnect(peer, why); }
  absl::StatusOr<MemoryHandle> RegisterMemory(void* base, uint64_t length, MemoryKind kind, int device) override {
    return inner_->RegisterMemory(base, length, kind, device);
  }
  absl::StatusOr<MemoryHandle> AllocateMemory(uint64_t length, MemoryKind kind, int device) override {
    return inner_->AllocateMemory(length, kind, device);
  }
  absl::Status DeregisterMemory(const MemoryHandle& h) override { return inner_->DeregisterMemory(h); }
  absl::StatusOr<v1::RemoteMemoryDescriptor> Describe(const MemoryHandle& h) override { return inner_->Describe(h); }
  std::unique_ptr<Completion> Put(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                  const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                  uint64_t length) override {
    return inner_->Put(peer, local, local_offset, remote, remote_offset, length);
  }
  std::unique_ptr<Completion> PutBatch(PeerId peer, const std::vector<PutOp>& ops) override {
    return inner_->PutBatch(peer, ops);
  }
  std::unique_ptr<Completion> Get(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                  const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                  uint64_t length) override {
    return inner_->Get(peer, local, local_offset, remote, remote_offset, length);
  }
  std::unique_ptr<Completion> Send(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                   uint64_t length) override {
    return inner_->Send(peer, tag, local, offset, length);
  }
  std::unique_ptr<Completion> Recv(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                   uint64_t capacity) override {
    return inner_->Recv(peer, tag, local, offset, capacity);
  }
  absl::StatusOr<std::unique_ptr<RemoteMapping>> MapRemote(PeerId peer,
                                                           const v1::RemoteMemoryDescriptor& remote) override {
    return inner_->MapRemote(peer, remote);
  }
  std::unique_ptr<Completion> SendRecvBatch(const std::vector<TwoSidedOp>& ops) override {
    return inner_->SendRecvBatch(ops);
  }

 protected:
  const std::unique_ptr<Transport> inner_;
};

}  // namespace rlfleet::transport

#endif  // RLFLEET_LIBS_TRANSPORT_FORWARDING_TRANSPORT_H_

// A decorator over any Transport that authenticates memory descriptors with a fleet
// secret, so that a process only ever reads or writes memory named by a descriptor a
// fleet member issued.
//
// Why: a RemoteMemoryDescriptor is a capability. With UCX, whoever holds one (and can
// reach the owner's worker) reads or writes that memory; the descriptor travels inside
// gRPC messages that several services forward (rollout -> buffer -> trainer, trainer
// -> weights -> replicas). Without this decorator, a caller that can reach one of those
// RPCs could hand a service a descriptor it made up (another process's region, another
// registration's address) and have the service write into it or read from it.
//
// What it does: Describe() attaches an HMAC-SHA256 over every field of the descriptor
// and an expiry, keyed by the secret; every Put / PutBatch / Get / MapRemote checks the
// MAC and the expiry of the remote descriptor before anything is submitted, and
// refuses with PERMISSION_DENIED ("descriptor MAC mismatch" / "descriptor expired")
// otherwise. Everything else passes straight through.
//
// What it does not do: it cannot stop a peer that holds a valid descriptor, nor a host
// on the data-plane network that speaks UCX directly to a worker with keys it obtained
// otherwise: keep the data plane on a private network (--data_plane_interface,
// Kubernetes NetworkPolicy; docs/security.md states the whole trust model).
//
// Thread-safe (the secret is immutable; the inner transport is thread-safe).
#ifndef RLFLEET_LIBS_TRANSPORT_AUTHENTICATED_AUTHENTICATED_TRANSPORT_H_
#define RLFLEET_LIBS_TRANSPORT_AUTHENTICATED_AUTHENTICATED_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "libs/transport/forwarding_transport.h"

namespace rlfleet::transport {

// Shortest secret accepted, in bytes (128 bits).
inline constexpr size_t kMinDataPlaneSecretBytes = 16;

// Signs `descriptor` in place: sets mac_expires_unix_ms to now + ttl and mac to
// HMAC-SHA256(secret, fields 1-10, expiry).
void SignDescriptor(const std::string& secret, absl::Duration ttl, v1::RemoteMemoryDescriptor* descriptor,
                    absl::Time now = absl::Now());

// OK if `descriptor` carries a MAC that matches under `secret` and has not expired at
// `now`; PERMISSION_DENIED saying which check failed otherwise.
absl::Status VerifyDescriptor(const std::string& secret, const v1::RemoteMemoryDescriptor& descriptor,
                              absl::Time now = absl::Now());

class AuthenticatedTransport : public ForwardingTransport {
 public:
  // `secret` must be at least kMinDataPlaneSecretBytes (aborts otherwise: callers
  // validate the flag first). Descriptors it issues expire `ttl` after Describe().
  AuthenticatedTransport(std::unique_ptr<Transport> inner, std::string secret, absl::Duration ttl = absl::Hours(24));

  Capabilities GetCapabilities() const override;
  absl::StatusOr<v1::RemoteMemoryDescriptor> Describe(const MemoryHandle& handle) override;
  std::unique_ptr<Completion> Put(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                  const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                  uint64_t length) override;
  std::unique_ptr<Completion> PutBatch(PeerId peer, const std::vector<PutOp>& ops) override;
  std::unique_ptr<Completion> Get(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                  const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                  uint64_t length) override;
  absl::StatusOr<std::unique_ptr<RemoteMapping>> MapRemote(PeerId peer,
                                                           const v1::RemoteMemoryDescriptor& remote) override;

 private:
  const std::string secret_;
  const absl::Duration ttl_;
};

}  // namespace rlfleet::transport

#endif  // RLFLEET_LIBS_TRANSPORT_AUTHENTICATED_AUTHENTICATED_TRANSPORT_H_

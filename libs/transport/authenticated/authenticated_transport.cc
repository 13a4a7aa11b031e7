#include "libs/transport/authenticated/authenticated_transport.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "libs/common/hmac.h"

namespace rlfleet::transport {
namespace {

void AppendU64(uint64_t v, std::string* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void AppendBytes(const std::string& bytes, std::string* out) {
  AppendU64(bytes.size(), out);
  out->append(bytes);
}

// An unambiguous encoding of everything the MAC covers: fixed-width integers and
// length-prefixed bytes, in field order, with a domain tag (so a MAC made for another
// purpose with the same secret never verifies here). Protobuf serialisation is not
// canonical, so it is not what is signed.
std::string SignedBytes(const v1::RemoteMemoryDescriptor& d) {
  std::string out = "rlfleet.v1.RemoteMemoryDescriptor/mac1";
  AppendU64(static_cast<uint64_t>(d.backend()), &out);
  AppendBytes(d.packed_rkey(), &out);
  AppendBytes(d.worker_address(), &out);
  AppendU64(d.base_address(), &out);
  AppendU64(d.length_bytes(), &out);
  AppendU64(static_cast<uint64_t>(d.memory_kind()), &out);
  AppendU64(static_cast<uint64_t>(static_cast<int64_t>(d.device_index())), &out);
  AppendU64(d.registration_id(), &out);
  AppendU64(d.registration_epoch(), &out);
  AppendBytes(d.owner_replica_id(), &out);
  AppendU64(d.mac_expires_unix_ms(), &out);
  return out;
}

std::string Mac(const std::string& secret, const v1::RemoteMemoryDescriptor& d) {
  return common::HmacSha256(secret, SignedBytes(d));
}

}  // namespace

void SignDescriptor(const std::string& secret, absl::Duration ttl, v1::RemoteMemoryDescriptor* descriptor,
                    absl::Time now) {
  descriptor->set_mac_expires_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(now + ttl)));
  descriptor->set_mac(Mac(secret, *descriptor));
}

absl::Status VerifyDescriptor(const std::string& secret, const v1::RemoteMemoryDescriptor& descriptor, absl::Time now) {
  if (descriptor.mac().empty()) {
    return absl::PermissionDeniedError(
        "remote memory descriptor carries no MAC: this fleet requires descriptors issued by a member holding "
        "the data-plane secret");
  }
  if (!common::ConstantTimeEquals(descriptor.mac(), Mac(secret, descriptor))) {
    return absl::PermissionDeniedError("remote memory descriptor MAC mismatch: forged or altered descriptor");
  }
  const int64_t now_ms = absl::ToUnixMillis(now);
  if (now_ms < 0 || static_cast<uint64_t>(now_ms) > descriptor.mac_expires_unix_ms()) {
    return absl::PermissionDeniedError(absl::StrCat("remote memory descriptor expired at ",
                                                    descriptor.mac_expires_unix_ms(), " ms since the epoch (now ",
                                                    now_ms, "): replayed or outlived its registration"));
  }
  return absl::OkStatus();
}

AuthenticatedTransport::AuthenticatedTransport(std::unique_ptr<Transport> inner, std::string secret, absl::Duration ttl)
    : ForwardingTransport(std::move(inner)), secret_(std::move(secret)), ttl_(ttl) {
  if (secret_.size() < kMinDataPlaneSecretBytes) {  // a programmer error: callers validate the flag
    std::cerr << "AuthenticatedTransport: data-plane secret shorter than " << kMinDataPlaneSecretBytes << " bytes"
              << std::endl;
    std::abort();
  }
}

Capabilities AuthenticatedTransport::GetCapabilities() const {
  Capabilities c = inner_->GetCapabilities();
  c.backend = absl::StrCat("authenticated(", c.backend, ")");
  return c;
}

absl::StatusOr<v1::RemoteMemoryDescriptor> AuthenticatedTransport::Describe(const MemoryHandle& handle) {
  absl::StatusOr<v1::RemoteMemoryDescriptor> d = inner_->Describe(handle);
  if (d.ok()) SignDescriptor(secret_, ttl_, &*d);
  return d;
}

std::unique_ptr<Completion> AuthenticatedTransport::Put(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                                        const v1::RemoteMemoryDescriptor& remote,
                                                        uint64_t remote_offset, uint64_t length) {
  if (absl::Status s = VerifyDescriptor(secret_, remote); !s.ok()) return CompletedWith(s);
  return inner_->Put(peer, local, local_offset, remote, remote_offset, length);
}

std::unique_ptr<Completion> AuthenticatedTransport::PutBatch(PeerId peer, const std::vector<PutOp>& ops) {
  for (const PutOp& op : ops) {
    if (op.remote == nullptr) return CompletedWith(absl::InvalidArgumentError("PutBatch: an op has no remote"));
    if (absl::Status s = VerifyDescriptor(secret_, *op.remote); !s.ok()) return CompletedWith(s);
  }
  return inner_->PutBatch(peer, ops);
}

std::unique_ptr<Completion> AuthenticatedTransport::Get(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                                        const v1::RemoteMemoryDescriptor& remote,
                                                        uint64_t remote_offset, uint64_t length) {
  if (absl::Status s = VerifyDescriptor(secret_, remote); !s.ok()) return CompletedWith(s);
  return inner_->Get(peer, local, local_offset, remote, remote_offset, length);
}

absl::StatusOr<std::unique_ptr<RemoteMapping>> AuthenticatedTransport::MapRemote(
    PeerId peer, const v1::RemoteMemoryDescriptor& remote) {
  if (absl::Status s = VerifyDescriptor(secret_, remote); !s.ok()) return s;
  return inner_->MapRemote(peer, remote);
}

}  // namespace rlfleet::transport

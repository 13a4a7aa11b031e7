#include "libs/transport/loopback/loopback_transport.h"

#include <cstring>
#include <optional>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "libs/common/status_macros.h"

namespace rlfleet::transport {

// One pending Send or Recv, waiting for its partner.
struct PendingOp {
  uint8_t* data;
  uint64_t length;  // bytes to send, or receive capacity
  std::shared_ptr<PendingCompletion> completion;
};

struct LoopbackTransport::Node {
  uint64_t node_id = 0;
  uint64_t epoch = 0;  // random per transport: descriptors of another instance are stale
  std::string address;

  absl::Mutex mu;
  bool alive ABSL_GUARDED_BY(mu) = true;
  uint64_t next_registration ABSL_GUARDED_BY(mu) = 1;
  std::map<uint64_t, MemoryHandle> registrations ABSL_GUARDED_BY(mu);
  std::map<uint64_t, std::unique_ptr<uint8_t[]>> allocations ABSL_GUARDED_BY(mu);
  uint64_t next_peer ABSL_GUARDED_BY(mu) = 1;
  std::map<PeerId, std::shared_ptr<Node>> peers ABSL_GUARDED_BY(mu);
  std::map<std::string, PeerId> peer_by_address ABSL_GUARDED_BY(mu);
  // Messages sent *to* this node, and receives posted *on* it, by (sender node, tag).
  std::map<std::pair<uint64_t, uint64_t>, std::deque<PendingOp>> sends ABSL_GUARDED_BY(mu);
  std::map<std::pair<uint64_t, uint64_t>, std::deque<PendingOp>> recvs ABSL_GUARDED_BY(mu);
};

// Address book of the transports of one test (or the process). Thread-safe.
class LoopbackFabric {
 public:
  static std::shared_ptr<LoopbackFabric> Default() {
    static auto* fabric = new std::shared_ptr<LoopbackFabric>(std::make_shared<LoopbackFabric>());
    return *fabric;
  }

  std::shared_ptr<LoopbackTransport::Node> NewNode() {
    auto node = std::make_shared<LoopbackTransport::Node>();
    absl::MutexLock lock(&mu_);
    node->node_id = next_node_++;
    node->epoch = absl::Uniform<uint64_t>(gen_) | 1;
    node->address = absl::StrCat("loopback:", node->node_id);
    nodes_[node->node_id] = node;
    return node;
  }

  std::shared_ptr<LoopbackTransport::Node> Find(uint64_t node_id) {
    absl::MutexLock lock(&mu_);
    auto it = nodes_.find(node_id);
    if (it == nodes_.end()) return nullptr;
    return it->second.lock();
  }

  std::vector<std::shared_ptr<LoopbackTransport::Node>> All() {
    absl::MutexLock lock(&mu_);
    std::vector<std::shared_ptr<LoopbackTransport::Node>> out;
    for (auto& [id, weak] : nodes_) {
      if (auto node = weak.lock()) out.push_back(node);
    }
    return out;
  }

  void Remove(uint64_t node_id) {
    absl::MutexLock lock(&mu_);
    nodes_.erase(node_id);
  }

 private:
  absl::Mutex mu_;
  uint64_t next_node_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::weak_ptr<LoopbackTransport::Node>> nodes_ ABSL_GUARDED_BY(mu_);
  absl::BitGen gen_ ABSL_GUARDED_BY(mu_);
};

namespace {

constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;

absl::StatusOr<uint64_t> ParseAddress(absl::string_view address) {
  uint64_t id = 0;
  if (!absl::ConsumePrefix(&address, "loopback:") || !absl::SimpleAtoi(address, &id) || id == 0) {
    return absl::InvalidArgumentError(absl::StrCat("`", address, "` is not a loopback transport address"));
  }
  return id;
}

// Looks up a live local registration covering the handle. Caller holds node.mu.
absl::StatusOr<MemoryHandle> FindLocal(LoopbackTransport::Node& node, const MemoryHandle& h)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(node.mu) {
  auto it = node.registrations.find(h.id);
  if (it == node.registrations.end() || it->second.base != h.base) {
    return absl::NotFoundError(absl::StrCat("local memory registration ", h.id, " is not registered (deregistered?)"));
  }
  return it->second;
}

}  // namespace

std::unique_ptr<LoopbackTransport> LoopbackTransport::Create(std::shared_ptr<LoopbackFabric> fabric) {
  if (fabric == nullptr) fabric = LoopbackFabric::Default();
  auto node = fabric->NewNode();
  return std::unique_ptr<LoopbackTransport>(new LoopbackTransport(fabric, node));
}

LoopbackTransport::LoopbackTransport(std::shared_ptr<LoopbackFabric> fabric, std::shared_ptr<Node> node)
    : fabric_(std::move(fabric)), node_(std::move(node)) {}

LoopbackTransport::~LoopbackTransport() { Close(); }

void LoopbackTransport::Close() {
  const absl::Status dead = absl::UnavailableError(absl::StrCat("peer ", node_->address, " closed or died"));
  std::vector<std::shared_ptr<PendingCompletion>> to_fail;
  {
    absl::MutexLock lock(&node_->mu);
    if (!node_->alive) return;
    node_->alive = false;
    for (auto* table : {&node_->sends, &node_->recvs}) {
      for (auto& [key, ops] : *table) {
        for (PendingOp& op : ops) to_fail.push_back(op.completion);
      }
      table->clear();
    }
    node_->registrations.clear();
    // Peers hold each other (shared_ptr both ways): a closed node lets go of its own,
    // or two connected transports would keep each other alive for good (found by ASan).
    node_->peers.clear();
    node_->peer_by_address.clear();
  }
  fabric_->Remove(node_->node_id);
  // Receives that other nodes posted for messages from this one, and sends this node
  // queued at others, can never complete now.
  for (const auto& other : fabric_->All()) {
    absl::MutexLock lock(&other->mu);
    for (auto* table : {&other->recvs, &other->sends}) {
      for (auto it = table->begin(); it != table->end();) {
        if (it->first.first == node_->node_id) {
          for (PendingOp& op : it->second) to_fail.push_back(op.completion);
          it = table->erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  for (auto& c : to_fail) c->Finish(dead, 0);
}

Capabilities LoopbackTransport::GetCapabilities() const {
  Capabilities caps;
  caps.backend = "loopback";
  caps.host_memory = true;
  caps.one_sided = true;
  caps.two_sided = true;
  caps.one_sided_fast = true;
  caps.maps_peer_memory = true;
  caps.max_message_bytes = kMaxMessageBytes;
  caps.detail = "in-process memcpy";
  return caps;
}

std::string LoopbackTransport::LocalAddress() const { return node_->address; }

absl::StatusOr<PeerId> LoopbackTransport::Connect(absl::string_view peer_address) {
  ASSIGN_OR_RETURN(uint64_t node_id, ParseAddress(peer_address));
  std::shared_ptr<Node> peer = fabric_->Find(node_id);
  if (peer == nullptr) {
    return absl::UnavailableError(absl::StrCat("no live loopback peer at ", peer_address));
  }
  absl::MutexLock lock(&node_->mu);
  if (!node_->alive) return absl::FailedPreconditionError("transport is closed");
  auto it = node_->peer_by_address.find(std::string(peer_address));
  if (it != node_->peer_by_address.end()) return it->second;
  const PeerId id = node_->next_peer++;
  node_->peers[id] = peer;
  node_->peer_by_address[std::string(peer_address)] = id;
  return id;
}

absl::StatusOr<MemoryHandle> LoopbackTransport::RegisterMemory(void* base, uint64_t length, MemoryKind kind,
                                                               int device) {
  if (base == nullptr) return absl::InvalidArgumentError("RegisterMemory: null base address");
  if (length == 0) return absl::InvalidArgumentError("RegisterMemory: zero length");
  if (kind != MemoryKind::kHost) {
    return absl::InvalidArgumentError("the loopback transport registers host memory only");
  }
  absl::MutexLock lock(&node_->mu);
  MemoryHandle handle{node_->next_registration++, base, length, kind, device};
  node_->registrations[handle.id] = handle;
  return handle;
}

absl::StatusOr<MemoryHandle> LoopbackTransport::AllocateMemory(uint64_t length, MemoryKind kind, int device) {
  if (length == 0) return absl::InvalidArgumentError("AllocateMemory: zero length");
  std::unique_ptr<uint8_t[]> bytes(new (std::nothrow) uint8_t[length]);
  if (bytes == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", length, " bytes"));
  }
  ASSIGN_OR_RETURN(MemoryHandle handle, RegisterMemory(bytes.get(), length, kind, device));
  absl::MutexLock lock(&node_->mu);
  node_->allocations[handle.id] = std::move(bytes);
  return handle;
}

absl::Status LoopbackTransport::DeregisterMemory(const MemoryHandle& handle) {
  absl::MutexLock lock(&node_->mu);
  if (node_->registrations.erase(handle.id) == 0) {
    return absl::NotFoundError(absl::StrCat("memory registration ", handle.id, " is not registered"));
  }
  node_->allocations.erase(handle.id);
  return absl::OkStatus();
}

absl::StatusOr<v1::RemoteMemoryDescriptor> LoopbackTransport::Describe(const MemoryHandle& handle) {
  absl::MutexLock lock(&node_->mu);
  ASSIGN_OR_RETURN(MemoryHandle h, FindLocal(*node_, handle));
  v1::RemoteMemoryDescriptor d;
  d.set_backend(v1::TRANSFER_BACKEND_LOOPBACK);
  d.set_worker_address(node_->address);
  d.set_packed_rkey(absl::StrCat("loopback-rkey:", h.id));
  d.set_base_address(reinterpret_cast<uint64_t>(h.base));
  d.set_length_bytes(h.length);
  d.set_memory_kind(v1::MEMORY_KIND_HOST);
  d.set_registration_id(h.id);
  d.set_registration_epoch(node_->epoch);
  return d;
}

namespace {
class LoopbackMapping : public RemoteMapping {
 public:
  LoopbackMapping(uint8_t* data, uint64_t length) : data_(data), length_(length) {}
  uint8_t* data() const override { return data_; }
  uint64_t length() const override { return length_; }

 private:
  uint8_t* const data_;
  const uint64_t length_;
};
}  // namespace

absl::StatusOr<std::unique_ptr<RemoteMapping>> LoopbackTransport::MapRemote(PeerId peer_id,
                                                                            const v1::RemoteMemoryDescriptor& remote) {
  if (remote.backend() != v1::TRANSFER_BACKEND_LOOPBACK) {
    return absl::InvalidArgumentError(
        absl::StrCat("MapRemote: remote descriptor is for backend ", remote.backend(), ", not loopback"));
  }
  std::shared_ptr<Node> peer;
  {
    absl::MutexLock lock(&node_->mu);
    if (!node_->alive) return absl::FailedPreconditionError("transport is closed");
    auto it = node_->peers.find(peer_id);
    if (it == node_->peers.end()) return absl::NotFoundError(absl::StrCat("MapRemote: unknown peer id ", peer_id));
    peer = it->second;
  }
  if (remote.worker_address() != peer->address) {
    return absl::InvalidArgumentError(
        absl::StrCat("MapRemote: remote descriptor belongs to ", remote.worker_address(), ", not peer ", peer_id));
  }
  absl::MutexLock lock(&peer->mu);
  if (!peer->alive) return absl::UnavailableError(absl::StrCat("peer ", peer->address, " died"));
  auto it = peer->registrations.find(remote.registration_id());
  if (remote.registration_epoch() != peer->epoch || it == peer->registrations.end() ||
      reinterpret_cast<uint64_t>(it->second.base) != remote.base_address() ||
      it->second.length != remote.length_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat("MapRemote: stale or unknown remote key: registration ",
                                                      remote.registration_id(), " is not registered at the peer"));
  }
  if (it->second.kind != MemoryKind::kHost) {
    return absl::UnimplementedError("MapRemote: only host memory maps");
  }
  return std::make_unique<LoopbackMapping>(static_cast<uint8_t*>(it->second.base), it->second.length);
}

std::unique_ptr<Completion> LoopbackTransport::OneSided(bool put, PeerId peer_id, const MemoryHandle& local,
                                                        uint64_t local_offset, const v1::RemoteMemoryDescriptor& remote,
                                                        uint64_t remote_offset, uint64_t length) {
  const char* op = put ? "Put" : "Get";
  if (remote.backend() != v1::TRANSFER_BACKEND_LOOPBACK) {
    return CompletedWith(absl::InvalidArgumentError(
        absl::StrCat(op, ": remote descriptor is for backend ", remote.backend(), ", not loopback")));
  }
  std::shared_ptr<Node> peer;
  uint8_t* local_ptr = nullptr;
  {
    absl::MutexLock lock(&node_->mu);
    if (!node_->alive) return CompletedWith(absl::FailedPreconditionError("transport is closed"));
    auto it = node_->peers.find(peer_id);
    if (it == node_->peers.end()) {
      return CompletedWith(absl::NotFoundError(absl::StrCat(op, ": unknown peer id ", peer_id)));
    }
    peer = it->second;
    auto h = FindLocal(*node_, local);
    if (!h.ok()) return CompletedWith(h.status());
    if (absl::Status s = CheckRange(absl::StrCat(op, " local range"), local_offset, length, h->length); !s.ok()) {
      return CompletedWith(s);
    }
    local_ptr = static_cast<uint8_t*>(h->base) + local_offset;
  }
  if (remote.worker_address() != peer->address) {
    return CompletedWith(absl::InvalidArgumentError(
        absl::StrCat(op, ": remote descriptor belongs to ", remote.worker_address(), ", not peer ", peer_id)));
  }
  absl::MutexLock lock(&peer->mu);
  if (!peer->alive) {
    return CompletedWith(absl::UnavailableError(absl::StrCat("peer ", peer->address, " died")));
  }
  if (remote.registration_epoch() != peer->epoch) {
    return CompletedWith(absl::FailedPreconditionError(
        absl::StrCat(op, ": stale remote key (registration epoch ", remote.registration_epoch(),
                     " is not the peer's current one; did it restart?)")));
  }
  auto it = peer->registrations.find(remote.registration_id());
  if (it == peer->registrations.end() || reinterpret_cast<uint64_t>(it->second.base) != remote.base_address() ||
      it->second.length != remote.length_bytes()) {
    return CompletedWith(
        absl::FailedPreconditionError(absl::StrCat(op, ": stale or unknown remote key: registration ",
                                                   remote.registration_id(), " is not registered at the peer")));
  }
  if (absl::Status s = CheckRange(absl::StrCat(op, " remote range"), remote_offset, length, it->second.length);
      !s.ok()) {
    return CompletedWith(s);
  }
  uint8_t* remote_ptr = static_cast<uint8_t*>(it->second.base) + remote_offset;
  if (put) {
    std::memcpy(remote_ptr, local_ptr, length);
  } else {
    std::memcpy(local_ptr, remote_ptr, length);
  }
  return CompletedWith(absl::OkStatus(), length);
}

std::unique_ptr<Completion> LoopbackTransport::Put(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                                   const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                                   uint64_t length) {
  return OneSided(true, peer, local, local_offset, remote, remote_offset, length);
}

std::unique_ptr<Completion> LoopbackTransport::Get(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                                   const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                                   uint64_t length) {
  return OneSided(false, peer, local, local_offset, remote, remote_offset, length);
}

namespace {

// Copies a matched send into a receive and finishes both.
void Deliver(const PendingOp& send, const PendingOp& recv) {
  const uint64_t n = std::min(send.length, recv.length);
  std::memcpy(recv.data, send.data, n);
  send.completion->Finish(absl::OkStatus(), send.length);
  if (send.length > recv.length) {
    recv.completion->Finish(absl::DataLossError(absl::StrCat("message of ", send.length, " bytes truncated to the ",
                                                             recv.length, "-byte receive buffer")),
                            n);
  } else {
    recv.completion->Finish(absl::OkStatus(), n);
  }
}

}  // namespace

std::unique_ptr<Completion> LoopbackTransport::Send(PeerId peer_id, uint64_t tag, const MemoryHandle& local,
                                                    uint64_t offset, uint64_t length) {
  std::shared_ptr<Node> peer;
  PendingOp op;
  {
    absl::MutexLock lock(&node_->mu);
    if (!node_->alive) return CompletedWith(absl::FailedPreconditionError("transport is closed"));
    auto it = node_->peers.find(peer_id);
    if (it == node_->peers.end()) {
      return CompletedWith(absl::NotFoundError(absl::StrCat("Send: unknown peer id ", peer_id)));
    }
    peer = it->second;
    auto h = FindLocal(*node_, local);
    if (!h.ok()) return CompletedWith(h.status());
    if (absl::Status s = CheckRange("Send", offset, length, h->length); !s.ok()) {
      return CompletedWith(s);
    }
    op.data = static_cast<uint8_t*>(h->base) + offset;
    op.length = length;
  }
  auto completion = std::make_shared<PendingCompletion>();
  op.completion = completion;
  std::optional<PendingOp> matched;
  {
    absl::MutexLock lock(&peer->mu);
    if (!peer->alive) {
      return CompletedWith(absl::UnavailableError(absl::StrCat("peer ", peer->address, " died")));
    }
    auto& recvs = peer->recvs[{node_->node_id, tag}];
    if (!recvs.empty()) {
      matched = recvs.front();
      recvs.pop_front();
    } else {
      peer->sends[{node_->node_id, tag}].push_back(op);
    }
  }
  if (matched) Deliver(op, *matched);
  return Share(completion);
}

namespace {
// A posted receive that Cancel takes back out of its node's queue.
class LoopbackRecv : public Completion {
 public:
  LoopbackRecv(std::shared_ptr<LoopbackTransport::Node> node, std::pair<uint64_t, uint64_t> key,
               std::shared_ptr<PendingCompletion> completion)
      : node_(std::move(node)), key_(key), completion_(std::move(completion)) {}
  absl::Status Wait(absl::Duration timeout) override { return completion_->Wait(timeout); }
  bool Done() override { return completion_->Done(); }
  uint64_t bytes() override { return completion_->bytes(); }
  void Cancel() override;

 private:
  const std::shared_ptr<LoopbackTransport::Node> node_;
  const std::pair<uint64_t, uint64_t> key_;
  const std::shared_ptr<PendingCompletion> completion_;
};
}  // namespace

void LoopbackRecv::Cancel() {
  bool removed = false;
  {
    absl::MutexLock lock(&node_->mu);
    auto it = node_->recvs.find(key_);
    if (it != node_->recvs.end()) {
      for (auto op = it->second.begin(); op != it->second.end(); ++op) {
        if (op->completion == completion_) {
          it->second.erase(op);
          removed = true;
          break;
        }
      }
    }
  }
  if (removed) completion_->Finish(absl::CancelledError("receive withdrawn"), 0);
}

std::unique_ptr<Completion> LoopbackTransport::Recv(PeerId peer_id, uint64_t tag, const MemoryHandle& local,
                                                    uint64_t offset, uint64_t capacity) {
  std::shared_ptr<Node> peer;
  PendingOp op;
  auto completion = std::make_shared<PendingCompletion>();
  op.completion = completion;
  std::optional<PendingOp> matched;
  {
    absl::MutexLock lock(&node_->mu);
    if (!node_->alive) return CompletedWith(absl::FailedPreconditionError("transport is closed"));
    auto it = node_->peers.find(peer_id);
    if (it == node_->peers.end()) {
      return CompletedWith(absl::NotFoundError(absl::StrCat("Recv: unknown peer id ", peer_id)));
    }
    peer = it->second;
    auto h = FindLocal(*node_, local);
    if (!h.ok()) return CompletedWith(h.status());
    if (absl::Status s = CheckRange("Recv", offset, capacity, h->length); !s.ok()) {
      return CompletedWith(s);
    }
    op.data = static_cast<uint8_t*>(h->base) + offset;
    op.length = capacity;
    // Lock order: a node's own mutex, then no other; the peer's liveness is read below.
    auto& sends = node_->sends[{peer->node_id, tag}];
    if (!sends.empty()) {
      matched = sends.front();
      sends.pop_front();
    } else {
      node_->recvs[{peer->node_id, tag}].push_back(op);
    }
  }
  if (matched) {
    Deliver(*matched, op);
    return Share(completion);
  }
  {
    absl::MutexLock lock(&peer->mu);
    if (!peer->alive) {
      completion->Finish(absl::UnavailableError(absl::StrCat("peer ", peer->address, " died")), 0);
    }
  }
  return std::make_unique<LoopbackRecv>(node_, std::make_pair(peer->node_id, tag), completion);
}

}  // namespace rlfleet::transport

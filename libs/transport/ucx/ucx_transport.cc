// UcxTransport's public operations over the worker in ucx_worker.cc.
#include "libs/transport/ucx/ucx_impl.h"

namespace rlfleet::transport {

namespace {

// Parameters for a send-like request (send, put, get, flush) of `op`. Immediate
// completion is allowed: with UCP_OP_ATTR_FLAG_NO_IMM_CMPL, UCX 1.13 never called back
// for a flush that had nothing left to wait for (seen as a hang). See Track().
ucp_request_param_t SendParam(void* op) {
  ucp_request_param_t param = {};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &Impl::OnSend;
  param.user_data = op;
  return param;
}

// Accounts for what a send-like nbx call returned: done now (null), failed, or pending
// (the callback finishes that part later).
void Track(Impl* impl, Impl::Op* op, void* request, const char* what) {
  if (request == nullptr) {
    impl->FinishPart(op, absl::OkStatus());
  } else if (UCS_PTR_IS_ERR(request)) {
    impl->FinishPart(op, UcsStatus(UCS_PTR_STATUS(request), what, __FILE__, __LINE__));
  }
}

}  // namespace

// ---- UcxTransport ----

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(const UcxOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  if (absl::Status s = impl->Init(); !s.ok()) {
    impl->Shutdown();
    return absl::UnavailableError(absl::StrCat("cannot start UCX: ", s.message()));
  }
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(impl)));
}

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UcxTransport::~UcxTransport() { impl_->Shutdown(); }

Capabilities UcxTransport::GetCapabilities() const { return impl_->caps_; }

uint64_t UcxTransport::rejected_control_messages() const { return impl_->rejected_control_.load(); }

std::string UcxTransport::LocalAddress() const { return impl_->local_address_; }

absl::StatusOr<PeerId> UcxTransport::Connect(absl::string_view peer_address) {
  std::string address(peer_address);
  Impl* impl = impl_.get();
  return impl->RunSync<PeerId>([impl, address] { return impl->ConnectOnThread(address, true); }, "Connect");
}

void UcxTransport::Disconnect(PeerId peer_id, const absl::Status& why) {
  Impl* impl = impl_.get();
  (void)impl->RunSync<bool>(
      [impl, peer_id, why]() -> absl::StatusOr<bool> {
        auto it = impl->peers_.find(peer_id);
        if (it == impl->peers_.end() || it->second->failed) return true;
        Impl::Peer* peer = it->second.get();
        peer->failed = true;
        peer->error = absl::UnavailableError(
            absl::StrCat("UCX peer ", absl::Hex(peer->instance), " disconnected: ", why.message()));
        impl->FailPeer(peer);  // (its ops fail; the next Connect makes a fresh endpoint)
        return true;
      },
      "Disconnect");
}

namespace {

// Registers memory with UCX (or, with base == nullptr, has UCX allocate it: on shared
// memory a posix segment that same-host peers map, so their Puts are a memcpy) and
// packs its framed remote key. ucp_mem_unmap releases either kind.
absl::StatusOr<MemoryHandle> MapMemory(Impl* impl, void* base, uint64_t length, MemoryKind kind, int device) {
  ucp_mem_map_params_t params = {};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = base;
  params.length = length;
  if (base == nullptr) {
    params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    params.flags = UCP_MEM_MAP_ALLOCATE;
  }
  Impl::Registration reg;
  RETURN_IF_ERROR(UCS_STATUS(ucp_mem_map(impl->context_, &params, &reg.memh), "ucp_mem_map"));
  if (base == nullptr) {
    ucp_mem_attr_t attr = {};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    ucs_status_t st = ucp_mem_query(reg.memh, &attr);
    if (st != UCS_OK) {
      ucp_mem_unmap(impl->context_, reg.memh);
      return UCS_STATUS(st, "ucp_mem_query");
    }
    base = attr.address;
  }
  void* rkey_buffer = nullptr;
  size_t rkey_size = 0;
  ucs_status_t st = ucp_rkey_pack(impl->context_, reg.memh, &rkey_buffer, &rkey_size);
  if (st != UCS_OK) {
    ucp_mem_unmap(impl->context_, reg.memh);
    return UCS_STATUS(st, "ucp_rkey_pack");
  }
  reg.handle = MemoryHandle{impl->next_registration_++, base, length, kind, device};
  reg.packed_rkey.assign(kRkeyMagic, 4);
  AppendU64(&reg.packed_rkey, impl->instance_);
  AppendU64(&reg.packed_rkey, reg.handle.id);
  AppendU64(&reg.packed_rkey, Hash64(rkey_buffer, rkey_size));
  reg.packed_rkey.append(static_cast<const char*>(rkey_buffer), rkey_size);
  ucp_rkey_buffer_release(rkey_buffer);
  MemoryHandle handle = reg.handle;
  impl->registrations_[handle.id] = std::move(reg);
  return handle;
}

}  // namespace

absl::StatusOr<MemoryHandle> UcxTransport::RegisterMemory(void* base, uint64_t length, MemoryKind kind, int device) {
  if (base == nullptr) return absl::InvalidArgumentError("RegisterMemory: null base address");
  if (length == 0) return absl::InvalidArgumentError("RegisterMemory: zero length");
  if (kind == MemoryKind::kCuda && !impl_->caps_.cuda_memory) {
    return absl::InvalidArgumentError("this UCX build has no CUDA memory support");
  }
  Impl* impl = impl_.get();
  return impl->RunSync<MemoryHandle>([=] { return MapMemory(impl, base, length, kind, device); });
}

absl::StatusOr<MemoryHandle> UcxTransport::AllocateMemory(uint64_t length, MemoryKind kind, int device) {
  if (length == 0) return absl::InvalidArgumentError("AllocateMemory: zero length");
  if (kind != MemoryKind::kHost) {
    return absl::InvalidArgumentError("the UCX backend allocates host memory only");
  }
  Impl* impl = impl_.get();
  if (!impl->tcp_only_) {
    // UCX allocates it: on shared memory a posix segment that same-host peers map, so
    // their Puts are a plain memcpy. (Not with tcp alone: no gain, and two in-process
    // tcp workers with UCX-allocated memory corrupted the heap in our suite.)
    return impl->RunSync<MemoryHandle>([=] { return MapMemory(impl, nullptr, length, kind, device); });
  }
  void* base = nullptr;
  const uint64_t page = 4096;
  if (posix_memalign(&base, page, (length + page - 1) / page * page) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", length, " bytes"));
  }
  auto handle = impl->RunSync<MemoryHandle>([=] { return MapMemory(impl, base, length, kind, device); });
  if (!handle.ok()) {
    free(base);
    return handle.status();
  }
  absl::MutexLock lock(&impl->worker_mu_);
  impl->owned_.insert(handle->id);
  return handle;
}

absl::Status UcxTransport::DeregisterMemory(const MemoryHandle& handle) {
  Impl* impl = impl_.get();
  // 1. Take the registration out of use and ask every connected peer to drop its key.
  auto wait = impl->RunSync<std::shared_ptr<Impl::RevokeWait>>(
      [impl, handle]() -> absl::StatusOr<std::shared_ptr<Impl::RevokeWait>> {
        auto it = impl->registrations_.find(handle.id);
        if (it == impl->registrations_.end() || it->second.handle.base != handle.base) {
          return absl::NotFoundError(absl::StrCat("memory registration ", handle.id, " is not registered"));
        }
        auto wait = std::make_shared<Impl::RevokeWait>();
        const uint64_t seq = impl->next_seq_++;
        wait->seq = seq;
        if (!it->second.described) {  // no peer can hold its key: nothing to revoke
          wait->done.Notify();
          impl->revokes_[seq] = wait;
          return wait;
        }
        // Peers that connected to us may hold the key: reach them too.
        for (const auto& [instance, address] : std::map<uint64_t, std::string>(impl->hello_addresses_)) {
          (void)impl->ConnectOnThread(address, /*send_hello=*/false);
        }
        std::string msg;
        AppendU64(&msg, impl->instance_);
        AppendU64(&msg, handle.id);
        AppendU64(&msg, seq);
        for (auto& [id, peer] : impl->peers_) {
          if (peer->failed || peer->ep == nullptr) continue;
          if (!peer->unresponsive) wait->waiting.insert(peer->instance);
          impl->SendAm(peer.get(), kAmRevoke, msg);
        }
        if (wait->waiting.empty()) wait->done.Notify();
        impl->revokes_[seq] = wait;
        return wait;
      },
      "DeregisterMemory's revoke");
  if (!wait.ok()) return wait.status();
  // 2. Wait until they acknowledged (their transfers with the key have finished).
  (void)(*wait)->done.WaitForNotificationWithTimeout(impl->options_.revoke_timeout);
  // 3. Unmap.
  const uint64_t seq = (*wait)->seq;
  return impl
      ->RunSync<bool>(
          [impl, handle, seq, wait = *wait]() -> absl::StatusOr<bool> {
            // Peers that did not ack in time are not waited for again until they answer.
            for (uint64_t instance : wait->waiting) {
              auto peer = impl->by_instance_.find(instance);
              if (peer != impl->by_instance_.end()) peer->second->unresponsive = true;
            }
            impl->revokes_.erase(seq);
            auto it = impl->registrations_.find(handle.id);
            if (it == impl->registrations_.end()) {
              return absl::NotFoundError(absl::StrCat("memory registration ", handle.id, " is not registered"));
            }
            ucp_mem_unmap(impl->context_, it->second.memh);
            if (impl->owned_.erase(handle.id)) free(it->second.handle.base);
            impl->registrations_.erase(it);
            return true;
          },
          "DeregisterMemory's unmap")
      .status();
}

absl::StatusOr<v1::RemoteMemoryDescriptor> UcxTransport::Describe(const MemoryHandle& handle) {
  Impl* impl = impl_.get();
  return impl->RunSync<v1::RemoteMemoryDescriptor>([impl, handle]() -> absl::StatusOr<v1::RemoteMemoryDescriptor> {
    auto it = impl->registrations_.find(handle.id);
    if (it == impl->registrations_.end() || it->second.handle.base != handle.base) {
      return absl::NotFoundError(absl::StrCat("memory registration ", handle.id, " is not registered"));
    }
    Impl::Registration& reg = it->second;
    reg.described = true;
    v1::RemoteMemoryDescriptor d;
    d.set_backend(v1::TRANSFER_BACKEND_UCX);
    d.set_packed_rkey(reg.packed_rkey);
    d.set_worker_address(impl->local_address_);
    d.set_base_address(reinterpret_cast<uint64_t>(reg.handle.base));
    d.set_length_bytes(reg.handle.length);
    d.set_memory_kind(reg.handle.kind == MemoryKind::kCuda ? v1::MEMORY_KIND_CUDA : v1::MEMORY_KIND_HOST);
    d.set_device_index(reg.handle.device);
    d.set_registration_id(reg.handle.id);
    d.set_registration_epoch(impl->instance_);
    return d;
  });
}

std::unique_ptr<Completion> UcxTransport::Put(PeerId peer_id, const MemoryHandle& local, uint64_t local_offset,
                                              const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                              uint64_t length) {
  return PutBatch(peer_id, {PutOp{local, local_offset, &remote, remote_offset, length}});
}

std::unique_ptr<Completion> UcxTransport::PutBatch(PeerId peer_id, const std::vector<PutOp>& ops) {
  Impl* impl = impl_.get();
  return impl->Submit([&](Impl::Op* op) {
    if (ops.empty()) return impl->FinishPart(op, absl::InvalidArgumentError("PutBatch: no puts"));
    // Validate everything before issuing anything.
    std::vector<std::pair<uint8_t*, ucp_rkey_h>> targets;
    Impl::Peer* peer = nullptr;
    for (const PutOp& p : ops) {
      auto resolved = impl->Resolve(peer_id, p.local, p.local_offset, p.length, "Put");
      if (!resolved.ok()) return impl->FinishPart(op, resolved.status());
      peer = resolved->first;
      if (p.remote == nullptr) return impl->FinishPart(op, absl::InvalidArgumentError("Put: no remote"));
      auto rkey = impl->RemoteKey(peer, *p.remote, p.remote_offset, p.length, "Put");
      if (!rkey.ok()) return impl->FinishPart(op, rkey.status());
      targets.emplace_back(resolved->second, *rkey);
    }
    op->peer = peer;
    // Each put, then one flush: the batch completes when every byte is remote. Over
    // shared memory small puts may sit in a FIFO until then; over tcp UCX emulates RMA.
    op->parts = static_cast<int>(ops.size()) + 1;
    for (size_t i = 0; i < ops.size(); ++i) {
      const PutOp& p = ops[i];
      op->bytes += p.length;
      op->rkey_registrations.push_back(p.remote->registration_id());
      ++peer->inflight[p.remote->registration_id()];
      ucp_request_param_t param = SendParam(op);
      Track(impl, op,
            ucp_put_nbx(peer->ep, targets[i].first, p.length, p.remote->base_address() + p.remote_offset,
                        targets[i].second, &param),
            "ucp_put_nbx");
    }
    ucp_request_param_t param = SendParam(op);
    Track(impl, op, ucp_ep_flush_nbx(peer->ep, &param), "ucp_ep_flush_nbx");
  });
}

namespace {

// Holds its own remote key (not the peer's cached one, which a revocation destroys),
// so the segment stays attached while the mapping lives.
class UcxMapping : public RemoteMapping {
 public:
  UcxMapping(Impl* impl, ucp_rkey_h rkey, uint8_t* data, uint64_t length)
      : impl_(impl), rkey_(rkey), data_(data), length_(length) {}
  ~UcxMapping() override {
    Impl* impl = impl_;
    ucp_rkey_h rkey = rkey_;
    (void)impl->RunSync<bool>([rkey]() -> absl::StatusOr<bool> {
      ucp_rkey_destroy(rkey);
      return true;
    });
  }
  uint8_t* data() const override { return data_; }
  uint64_t length() const override { return length_; }

 private:
  Impl* const impl_;
  const ucp_rkey_h rkey_;
  uint8_t* const data_;
  const uint64_t length_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteMapping>> UcxTransport::MapRemote(PeerId peer_id,
                                                                       const v1::RemoteMemoryDescriptor& remote) {
  if (!impl_->caps_.maps_peer_memory) {
    return absl::UnimplementedError(absl::StrCat("MapRemote: no shared-memory transport in ", impl_->caps_.detail));
  }
  if (remote.memory_kind() != v1::MEMORY_KIND_HOST) {
    return absl::UnimplementedError("MapRemote: only host memory maps");
  }
  Impl* impl = impl_.get();
  return impl->RunSync<std::unique_ptr<RemoteMapping>>(
      [impl, peer_id, &remote]() -> absl::StatusOr<std::unique_ptr<RemoteMapping>> {
        auto pit = impl->peers_.find(peer_id);
        if (pit == impl->peers_.end()) {
          return absl::NotFoundError(absl::StrCat("MapRemote: unknown peer id ", peer_id));
        }
        Impl::Peer* peer = pit->second.get();
        if (peer->failed) return peer->error;
        ASSIGN_OR_RETURN(ucp_rkey_h rkey, impl->RemoteKey(peer, remote, 0, remote.length_bytes(), "MapRemote", false));
        void* data = nullptr;
        const ucs_status_t st = ucp_rkey_ptr(rkey, remote.base_address(), &data);
        if (st != UCS_OK) {
          ucp_rkey_destroy(rkey);
          return absl::UnimplementedError(
              absl::StrCat("MapRemote: the peer's memory does not map here (ucp_rkey_ptr: ", ucs_status_string(st),
                           "; another host, or not from its AllocateMemory)"));
        }
        return std::unique_ptr<RemoteMapping>(
            new UcxMapping(impl, rkey, static_cast<uint8_t*>(data), remote.length_bytes()));
      },
      "MapRemote");
}

std::unique_ptr<Completion> UcxTransport::Get(PeerId peer_id, const MemoryHandle& local, uint64_t local_offset,
                                              const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                              uint64_t length) {
  Impl* impl = impl_.get();
  return impl->Submit([=](Impl::Op* op) {
    auto resolved = impl->Resolve(peer_id, local, local_offset, length, "Get");
    if (!resolved.ok()) return impl->FinishPart(op, resolved.status());
    Impl::Peer* peer = resolved->first;
    auto rkey = impl->RemoteKey(peer, remote, remote_offset, length, "Get");
    if (!rkey.ok()) return impl->FinishPart(op, rkey.status());
    op->peer = peer;
    op->bytes = length;
    op->rkey_registrations.push_back(remote.registration_id());
    ++peer->inflight[remote.registration_id()];
    ucp_request_param_t param = SendParam(op);
    Track(impl, op,
          ucp_get_nbx(peer->ep, resolved->second, length, remote.base_address() + remote_offset, *rkey, &param),
          "ucp_get_nbx");
  });
}

std::unique_ptr<Completion> UcxTransport::Send(PeerId peer_id, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                               uint64_t length) {
  if (tag > kMaxUserTag) {
    return CompletedWith(
        absl::InvalidArgumentError(absl::StrCat("Send: tag ", tag, " exceeds the UCX backend's 32-bit tag space")));
  }
  Impl* impl = impl_.get();
  return impl->Submit([=](Impl::Op* op) {
    auto resolved = impl->Resolve(peer_id, local, offset, length, "Send");
    if (!resolved.ok()) return impl->FinishPart(op, resolved.status());
    Impl::Peer* peer = resolved->first;
    op->peer = peer;
    op->bytes = length;
    ucp_request_param_t param = SendParam(op);
    const ucp_tag_t ucx_tag = (uint64_t{impl->tag_id_} << 32) | tag;
    Track(impl, op, ucp_tag_send_nbx(peer->ep, resolved->second, length, ucx_tag, &param), "ucp_tag_send_nbx");
  });
}

std::unique_ptr<Completion> UcxTransport::Recv(PeerId peer_id, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                               uint64_t capacity) {
  if (tag > kMaxUserTag) {
    return CompletedWith(
        absl::InvalidArgumentError(absl::StrCat("Recv: tag ", tag, " exceeds the UCX backend's 32-bit tag space")));
  }
  Impl* impl = impl_.get();
  return impl->Submit([=](Impl::Op* op) {
    auto resolved = impl->Resolve(peer_id, local, offset, capacity, "Recv");
    if (!resolved.ok()) return impl->FinishPart(op, resolved.status());
    Impl::Peer* peer = resolved->first;
    op->peer = peer;
    op->bytes = capacity;
    op->is_recv = true;
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv = &Impl::OnRecv;
    param.user_data = op;
    const ucp_tag_t ucx_tag = (uint64_t{peer->tag_id} << 32) | tag;
    op->posting = true;
    void* request = ucp_tag_recv_nbx(impl->worker_, resolved->second, capacity, ucx_tag, ~ucp_tag_t{0}, &param);
    op->posting = false;
    if (op->finished) {
      // The message was already there: OnRecv ran inside the call and finished the op
      // (and freed the request). Recording it in peer->recvs used to leave a freed op
      // there, which Shutdown then cancelled: a SIGSEGV in ucp_request_cancel when a
      // replica stopped mid-transfer was terminated.
      impl->ops_.erase(op);
      delete op;
      return;
    }
    if (UCS_PTR_IS_ERR(request)) {
      return impl->FinishPart(op, UCS_STATUS(UCS_PTR_STATUS(request), "ucp_tag_recv_nbx"));
    }
    op->request = request;
    peer->recvs.insert(op);
  });
}

}  // namespace rlfleet::transport

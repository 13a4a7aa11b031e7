// The UCX worker behind UcxTransport: start-up, the progress loop, peers and their
// failure, control messages (hello, key revocation), and completion plumbing.
#include <ucs/memory/memory_type.h>

#include "libs/transport/ucx/ucx_impl.h"

namespace rlfleet::transport {

absl::Status Impl::Init() {
  absl::BitGen gen;
  instance_ = absl::Uniform<uint64_t>(gen) | 1;
  tag_id_ = static_cast<uint32_t>(instance_ >> 32) | 1;

  // tcp defaults the environment can override (process-wide: UCX reads its transports'
  // settings from the environment): connect() runs in progress instead of blocking the
  // worker, and with it every transfer of this process, on a peer that does not answer
  // (a host cut off: SYN retries back off to ~2 minutes); idle connections are probed
  // every second after 2 s. (UCX_TCP_SYN_CNT would bound the SYN retries, but UCX 1.13
  // fails ucp_worker_create with any value set: "Invalid memory pool parameter(s)".)
  for (const auto& [name, value] : {std::pair<const char*, const char*>{"UCX_TCP_CONN_NB", "y"},
                                    {"UCX_TCP_KEEPIDLE", "2s"},
                                    {"UCX_TCP_KEEPINTVL", "1s"},
                                    {"UCX_TCP_KEEPCNT", "5"}}) {
    setenv(name, value, /*overwrite=*/0);
  }
  ucp_config_t* config = nullptr;
  RETURN_IF_ERROR(UCS_STATUS(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read"));
  std::string tls = options_.tls;
  if (tls.empty() && std::getenv("UCX_TLS") != nullptr) tls = std::getenv("UCX_TLS");
  if (!options_.tls.empty()) {
    absl::Status s = UCS_STATUS(ucp_config_modify(config, "TLS", options_.tls.c_str()), "ucp_config_modify(TLS)");
    if (!s.ok()) {
      ucp_config_release(config);
      return s;
    }
  }
  std::string net_devices = std::getenv("UCX_NET_DEVICES") ? std::getenv("UCX_NET_DEVICES") : "";
  if (!options_.net_devices.empty()) {
    net_devices = options_.net_devices;
    if (ucp_config_modify(config, "NET_DEVICES", net_devices.c_str()) != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(absl::StrCat("UCX refuses net devices \"", net_devices, "\""));
    }
  } else if (options_.loopback_only && net_devices.empty()) {
    net_devices = "lo";
    (void)ucp_config_modify(config, "NET_DEVICES", "lo");
  }
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
    const std::string ka = absl::StrCat(absl::ToInt64Milliseconds(options_.keepalive_interval), "ms");
    (void)ucp_config_modify(config, "KEEPALIVE_INTERVAL", ka.c_str());
  }

  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_AM;
  ucs_status_t st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  RETURN_IF_ERROR(UCS_STATUS(st, absl::StrCat("ucp_init(UCX_TLS=", tls.empty() ? "all" : tls, ")")));

  ucp_worker_params_t wparams = {};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  RETURN_IF_ERROR(UCS_STATUS(ucp_worker_create(context_, &wparams, &worker_), "ucp_worker_create"));

  for (AmId id : {kAmHello, kAmRevoke, kAmRevokeAck}) {
    ucp_am_handler_param_t am = {};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    am.id = id;
    am.cb = &Impl::OnAm;
    am.arg = this;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    RETURN_IF_ERROR(UCS_STATUS(ucp_worker_set_am_recv_handler(worker_, &am), "ucp_worker_set_am_recv_handler"));
  }

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  RETURN_IF_ERROR(UCS_STATUS(ucp_worker_get_address(worker_, &address, &address_length), "ucp_worker_get_address"));
  local_address_.assign(kAddressMagic, sizeof(kAddressMagic));
  AppendU64(&local_address_, instance_);
  AppendU64(&local_address_, static_cast<uint64_t>(getpid()));
  AppendU64(&local_address_, HostHash());
  local_address_.append(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(worker_, address);

  ucp_context_attr_t attr = {};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  (void)ucp_context_query(context_, &attr);
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);

  // One-sided is slow when tcp is the only transport besides self (UCX emulates RMA).
  bool tcp_only = false;
  if (!tls.empty()) {
    tcp_only = true;
    for (absl::string_view t : absl::StrSplit(tls, ',', absl::SkipEmpty())) {
      if (t != "tcp" && t != "self") tcp_only = false;
    }
  }
  tcp_only_ = tcp_only;
  caps_.backend = "ucx";
  caps_.host_memory = true;
  caps_.cuda_memory = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  caps_.one_sided = true;
  caps_.two_sided = true;
  caps_.one_sided_fast = !tcp_only;
  // A shared-memory transport maps same-host peers' UCX-allocated memory.
  caps_.maps_peer_memory = tls.empty();
  for (absl::string_view t : absl::StrSplit(tls, ',', absl::SkipEmpty())) {
    if (t == "all" || t == "sm" || t == "shm" || t == "posix" || t == "sysv" || t == "xpmem") {
      caps_.maps_peer_memory = true;
    }
  }
  caps_.max_message_bytes = uint64_t{1} << 38;
  caps_.max_tag = kMaxUserTag;
  caps_.detail = absl::StrCat("UCX ", major, ".", minor, ".", release, ", UCX_TLS=", tls.empty() ? "all" : tls,
                              ", UCX_NET_DEVICES=", net_devices.empty() ? "all" : net_devices,
                              tcp_only ? "; one-sided ops are emulated over tcp: use Send/Recv for bulk" : "");

  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return absl::InternalError("eventfd failed");
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Impl::ReportSlow(const char* what, absl::Duration waited, absl::Duration held) {
  constexpr absl::Duration kSlowWorker = absl::Seconds(1);
  if (waited < kSlowWorker && held < kSlowWorker) return;
  static absl::Mutex said_mu(absl::kConstInit);
  static std::map<std::string, absl::Time>* said = new std::map<std::string, absl::Time>();
  {
    absl::MutexLock lock(&said_mu);
    absl::Time& last = (*said)[what];
    if (absl::Now() - last < absl::Minutes(1)) return;
    last = absl::Now();
  }
  std::fprintf(stderr, "rlfleet ucx: %s waited %.1f s for the UCX worker and held it %.1f s\n", what,
               absl::ToDoubleSeconds(waited), absl::ToDoubleSeconds(held));
}

bool Impl::DriveLocked() {
  std::deque<std::function<void()>> tasks;
  {
    absl::MutexLock lock(&mu_);
    tasks.swap(tasks_);
  }
  absl::Time start = absl::Now();
  for (auto& task : tasks) task();
  ReportSlow("the worker's posted tasks", absl::ZeroDuration(), absl::Now() - start);
  start = absl::Now();
  unsigned events = 0;
  for (unsigned n; (n = ucp_worker_progress(worker_)) > 0;) events += n;
  ReportSlow("ucp_worker_progress", absl::ZeroDuration(), absl::Now() - start);
  if (events == 0 && tasks.empty()) {
    CheckLiveness();
    return false;
  }
  return true;
}

void Impl::Loop() {
  int idle = 0;
  for (;;) {
    bool did = false;
    if (waiters_.load(std::memory_order_relaxed) == 0) {
      absl::MutexLock lock(&worker_mu_);
      if (stop_) break;
      did = DriveLocked();
    } else {
      absl::MutexLock lock(&worker_mu_);
      if (stop_) break;
    }
    if (did) {
      idle = 0;
      continue;
    }
    // Spin a while (transfers often continue at once), but yield the core: on small
    // machines the application's threads and the peer need it more than an idle loop.
    if (waiters_.load(std::memory_order_relaxed) == 0 && ++idle < kIdleSpins) {
      sched_yield();
      continue;
    }
    pollfd pfd{wake_fd_, POLLIN, 0};
    if (poll(&pfd, 1, 1) > 0) {
      uint64_t drained;
      (void)!read(wake_fd_, &drained, sizeof(drained));
    }
  }
}

void Impl::CheckLiveness() {
  const absl::Time now = absl::Now();
  if (now - last_liveness_check_ < kLivenessInterval) return;
  last_liveness_check_ = now;
  for (auto& [id, peer] : peers_) {
    if (!peer->watch_pid || peer->failed) continue;
    if (kill(peer->pid, 0) != 0 && errno == ESRCH) OnPeerError(peer.get(), UCS_ERR_CONNECTION_RESET);
  }
}

void Impl::Shutdown() {
  if (!thread_.joinable()) {
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
    if (wake_fd_ >= 0) close(wake_fd_);
    worker_ = nullptr;
    context_ = nullptr;
    wake_fd_ = -1;
    return;
  }
  auto done = RunSync<bool>([this]() -> absl::StatusOr<bool> {
    const absl::Status closed = absl::UnavailableError("UCX transport closed");
    for (auto& [id, peer] : peers_) {
      // (a copy: a cancelled receive's callback runs at once and erases its op from
      // peer->recvs, which would invalidate this loop's iterator)
      for (Op* op : std::set<Op*>(peer->recvs)) {
        op->override = closed;
        if (op->request != nullptr) ucp_request_cancel(worker_, op->request);
      }
      for (auto& [reg, rkey] : peer->rkeys) ucp_rkey_destroy(rkey);
      peer->rkeys.clear();
    }
    std::vector<void*> closing;
    for (auto& [id, peer] : peers_) {
      if (peer->ep == nullptr) continue;
      ucp_request_param_t param = {};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      // Force needs peer-failure mode on both sides; otherwise flush and close.
      param.flags = peer->peer_failure_mode || peer->failed ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      void* request = ucp_ep_close_nbx(peer->ep, &param);
      if (UCS_PTR_IS_PTR(request)) closing.push_back(request);
      peer->ep = nullptr;
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    for (void* request : closing) {
      while (ucp_request_check_status(request) == UCS_INPROGRESS && absl::Now() < deadline) {
        ucp_worker_progress(worker_);
      }
      ucp_request_free(request);
    }
    for (auto& [id, reg] : registrations_) {
      ucp_mem_unmap(context_, reg.memh);
      if (owned_.erase(id)) free(reg.handle.base);
    }
    registrations_.clear();
    for (auto& [seq, wait] : revokes_) {
      if (!wait->done.HasBeenNotified()) wait->done.Notify();
    }
    for (Op* op : ops_) op->completion->Finish(closed, 0);  // ops UCX never finished
    stop_ = true;
    return true;
  });
  (void)done;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  // Ops UCX never called back for (a peer killed mid-transfer) are finished above; with
  // the worker gone no callback can reach them any more, so they are freed here (ASan
  // found them leaked).
  for (Op* op : ops_) delete op;
  ops_.clear();
  if (context_ != nullptr) ucp_cleanup(context_);
  if (wake_fd_ >= 0) close(wake_fd_);
  worker_ = nullptr;
  context_ = nullptr;
}

absl::StatusOr<PeerId> Impl::ConnectOnThread(const std::string& address, bool send_hello) {
  if (address.size() <= kAddressHeader || std::memcmp(address.data(), kAddressMagic, sizeof(kAddressMagic)) != 0) {
    return absl::InvalidArgumentError("not a UCX transport address (bad magic or too short)");
  }
  const uint64_t instance = ReadU64(address.data() + sizeof(kAddressMagic));
  auto it = by_instance_.find(instance);
  if (it != by_instance_.end()) {
    Peer* known = it->second;
    if (!known->failed) return known->id;
    // A peer whose process is gone stays failed; one that failed while its process
    // lives (its link broke and may be back) gets a fresh endpoint. The failed one
    // stays in peers_ (its operations still name it) and keeps failing them.
    if (known->watch_pid && kill(known->pid, 0) != 0) return known->error;
    by_instance_.erase(it);
  }
  auto peer = std::make_unique<Peer>();
  peer->impl = this;
  peer->id = next_peer_++;
  peer->instance = instance;
  peer->tag_id = static_cast<uint32_t>(instance >> 32) | 1;
  peer->address = address;
  peer->pid = static_cast<pid_t>(ReadU64(address.data() + 16));
  const bool same_host = ReadU64(address.data() + 24) == HostHash();
  ucp_ep_params_t params = {};
  params.field_mask =
      UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data() + kAddressHeader);
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t status) {
    auto* p = static_cast<Peer*>(arg);
    p->impl->OnPeerError(p, status);
  };
  params.err_handler.arg = peer.get();
  if (same_host) {
    // UCX 1.13's shared-memory transports have no peer-failure handling, and asking for
    // it would push a same-host peer onto tcp: connect without it and watch the peer's
    // pid instead (a dead peer is still an error within ~100 ms).
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    peer->watch_pid = true;
  }
  RETURN_IF_ERROR(UCS_STATUS(ucp_ep_create(worker_, &params, &peer->ep), "ucp_ep_create"));
  peer->peer_failure_mode = !peer->watch_pid;
  Peer* raw = peer.get();
  by_instance_[instance] = raw;
  peers_[raw->id] = std::move(peer);
  hello_addresses_.erase(instance);
  if (send_hello) SendAm(raw, kAmHello, local_address_);
  return raw->id;
}

void Impl::OnPeerError(Peer* peer, ucs_status_t status) {
  if (peer->failed) return;
  peer->failed = true;
  peer->error = absl::UnavailableError(
      absl::StrCat("UCX peer ", absl::Hex(peer->instance), " failed: ", ucs_status_string(status)));
  Post([this, peer] { FailPeer(peer); });  // not from inside UCX's callback
}

void Impl::FailPeer(Peer* peer) {
  // Transfers with the dead peer fail now: without UCX peer-failure handling (shared
  // memory) UCX may never complete them. Their ops are freed when UCX lets go of them.
  for (Op* op : ops_) {
    if (op->peer != peer) continue;
    op->override = peer->error;
    op->completion->Finish(peer->error, 0);
  }
  for (Op* op : std::set<Op*>(peer->recvs)) {
    op->override = peer->error;
    if (op->request != nullptr) ucp_request_cancel(worker_, op->request);
  }
  for (auto& [reg, rkey] : peer->rkeys) ucp_rkey_destroy(rkey);
  peer->rkeys.clear();
  // Revocations waiting on this peer need not wait any longer.
  for (auto& [seq, wait] : revokes_) {
    if (wait->waiting.erase(peer->instance) && wait->waiting.empty()) wait->done.Notify();
  }
  if (peer->ep != nullptr) {
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    param.cb.send = [](void* request, ucs_status_t, void*) { ucp_request_free(request); };
    (void)ucp_ep_close_nbx(peer->ep, &param);
    peer->ep = nullptr;
  }
}

void Impl::SendAm(Peer* peer, AmId id, std::string payload) {
  if (peer->ep == nullptr || peer->failed) return;
  auto* data = new std::string(1, static_cast<char>(id));
  data->append(payload);
  // Authenticated: the MAC covers the kind byte and the payload, and travels last.
  if (!options_.control_secret.empty()) data->append(common::HmacSha256(options_.control_secret, *data));
  ucp_request_param_t param = {};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  param.user_data = data;
  param.cb.send = [](void* request, ucs_status_t, void* user_data) {
    delete static_cast<std::string*>(user_data);
    ucp_request_free(request);
  };
  void* request = ucp_am_send_nbx(peer->ep, id, nullptr, 0, data->data(), data->size(), &param);
  if (!UCS_PTR_IS_PTR(request)) delete data;  // finished at once (or failed)
}

ucs_status_t Impl::OnAm(void* arg, const void* /*header*/, size_t /*header_length*/, void* data, size_t length,
                        const ucp_am_recv_param_t* param) {
  auto* impl = static_cast<Impl*>(arg);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK;  // never sent by us
  std::string payload(static_cast<const char*>(data), length);
  if (!impl->options_.control_secret.empty()) {
    const size_t n = common::kHmacSha256Bytes;
    if (payload.size() <= n ||
        !common::ConstantTimeEquals(payload.substr(payload.size() - n),
                                    common::HmacSha256(impl->options_.control_secret,
                                                       absl::string_view(payload).substr(0, payload.size() - n)))) {
      impl->rejected_control_.fetch_add(1);  // forged, altered, or from a peer without the secret
      return UCS_OK;
    }
    payload.resize(payload.size() - n);
  }
  // The handler id is not passed to the callback: the payload's first byte says which.
  if (payload.empty()) return UCS_OK;
  const char kind = payload[0];
  payload.erase(0, 1);
  impl->Post([impl, kind, payload = std::move(payload)] {
    if (kind == kAmHello && payload.size() > kAddressHeader) {
      // Creating the endpoint back now, while the peer's endpoint is still wiring up,
      // trips an assertion in UCX 1.13; it is created when first needed instead.
      const uint64_t instance = ReadU64(payload.data() + sizeof(kAddressMagic));
      if (!impl->by_instance_.count(instance)) impl->hello_addresses_[instance] = payload;
    } else if (kind == kAmRevoke && payload.size() == 24) {
      impl->HandleRevoke(ReadU64(payload.data()), ReadU64(payload.data() + 8), ReadU64(payload.data() + 16));
    } else if (kind == kAmRevokeAck && payload.size() == 16) {
      impl->HandleRevokeAck(ReadU64(payload.data()), ReadU64(payload.data() + 8));
    }
  });
  return UCS_OK;
}

void Impl::HandleRevoke(uint64_t owner, uint64_t registration, uint64_t seq) {
  auto it = by_instance_.find(owner);
  if (it == by_instance_.end()) {
    // The owner connected to us but we never to it: we hold none of its keys, but it
    // waits for our ack (it used to wait out revoke_timeout, 5 s, on every deregister:
    // a relaying replica serving its next version). Connect back to answer.
    auto hello = hello_addresses_.find(owner);
    if (hello == hello_addresses_.end()) return;  // never heard of it: it does not wait for us
    const std::string address = hello->second;
    if (!ConnectOnThread(address, /*send_hello=*/false).ok()) return;
    it = by_instance_.find(owner);
    if (it == by_instance_.end()) return;
  }
  Peer* peer = it->second;
  peer->revoked.insert(registration);
  if (peer->inflight[registration] > 0) {
    peer->deferred_acks[registration].push_back(seq);
    return;
  }
  ReleaseRkeyIfIdle(peer, registration);
  std::string ack;
  AppendU64(&ack, instance_);
  AppendU64(&ack, seq);
  SendAm(peer, kAmRevokeAck, ack);
}

void Impl::HandleRevokeAck(uint64_t from_instance, uint64_t seq) {
  if (auto peer = by_instance_.find(from_instance); peer != by_instance_.end()) peer->second->unresponsive = false;
  auto it = revokes_.find(seq);
  if (it == revokes_.end()) return;
  if (it->second->waiting.erase(from_instance) && it->second->waiting.empty()) {
    it->second->done.Notify();
  }
}

void Impl::ReleaseRkeyIfIdle(Peer* peer, uint64_t registration) {
  if (peer->inflight[registration] > 0) return;
  peer->inflight.erase(registration);
  auto rk = peer->rkeys.find(registration);
  if (rk != peer->rkeys.end()) {
    ucp_rkey_destroy(rk->second);
    peer->rkeys.erase(rk);
  }
  auto deferred = peer->deferred_acks.find(registration);
  if (deferred != peer->deferred_acks.end()) {
    for (uint64_t seq : deferred->second) {
      std::string ack;
      AppendU64(&ack, instance_);
      AppendU64(&ack, seq);
      SendAm(peer, kAmRevokeAck, ack);
    }
    peer->deferred_acks.erase(deferred);
  }
}

void Impl::FinishPart(Op* op, absl::Status status) {
  if (!status.ok() && op->status.ok()) op->status = std::move(status);
  if (--op->parts > 0) return;
  absl::Status final_status = op->status;
  if (absl::IsCancelled(final_status) && !op->override.ok()) final_status = op->override;
  if (op->peer != nullptr && op->is_recv) op->peer->recvs.erase(op);
  for (uint64_t registration : op->rkey_registrations) {
    Peer* peer = op->peer;
    if (--peer->inflight[registration] <= 0 && peer->revoked.count(registration)) {
      ReleaseRkeyIfIdle(peer, registration);
    }
  }
  op->completion->Finish(final_status, final_status.ok() || absl::IsDataLoss(final_status) ? op->bytes : 0);
  if (op->posting) {  // (called back from inside the call that posts it: the poster frees it)
    op->finished = true;
    return;
  }
  ops_.erase(op);
  delete op;
}

void Impl::OnSend(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  ucp_request_free(request);
  op->impl->FinishPart(op, UCS_STATUS(status, "UCX transfer"));
}

void Impl::OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->request = nullptr;
  ucp_request_free(request);
  const uint64_t capacity = op->bytes;
  if (status == UCS_OK) op->bytes = info->length;
  absl::Status s;
  if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    s = absl::DataLossError(absl::StrCat("message larger than the ", capacity, "-byte receive buffer (truncated)"));
  } else {
    s = UCS_STATUS(status, "ucp_tag_recv_nbx");
  }
  op->impl->FinishPart(op, s);
}

absl::StatusOr<std::pair<Impl::Peer*, uint8_t*>> Impl::Resolve(PeerId peer_id, const MemoryHandle& local,
                                                               uint64_t offset, uint64_t length,
                                                               absl::string_view what) {
  auto pit = peers_.find(peer_id);
  if (pit == peers_.end()) return absl::NotFoundError(absl::StrCat(what, ": unknown peer id ", peer_id));
  Peer* peer = pit->second.get();
  if (peer->failed) return peer->error;
  auto rit = registrations_.find(local.id);
  if (rit == registrations_.end() || rit->second.handle.base != local.base) {
    return absl::NotFoundError(
        absl::StrCat(what, ": local memory registration ", local.id, " is not registered (deregistered?)"));
  }
  RETURN_IF_ERROR(CheckRange(absl::StrCat(what, " local range"), offset, length, rit->second.handle.length));
  return std::make_pair(peer, static_cast<uint8_t*>(rit->second.handle.base) + offset);
}

namespace {

// UCX 1.13 unpacks a remote key without its length (ucp_ep_rkey_unpack): a key whose
// MD map claims more parts than the bytes hold is read past its end (the ucx_rkey
// fuzzer crashed UCX with 11 bytes claiming 36 parts). So the layout UCX will walk is
// checked against the bytes first: the MD map (8 bytes), the memory type (1 byte,
// below UCS_MEMORY_TYPE_LAST), then per MD in the map a size byte and that many bytes,
// all inside `n` (what follows is UCX's optional device information).
bool PackedRkeyFits(const char* p, size_t n) {
  if (n < 9) return false;
  const uint64_t md_map = ReadU64(p);
  if (static_cast<uint8_t>(p[8]) >= UCS_MEMORY_TYPE_LAST) return false;
  size_t at = 9;
  for (int md = 0; md < 64; ++md) {
    if ((md_map & (uint64_t{1} << md)) == 0) continue;
    if (at >= n) return false;
    const size_t size = static_cast<uint8_t>(p[at]);
    at += 1 + size;
    if (at > n) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<ucp_rkey_h> Impl::RemoteKey(Peer* peer, const v1::RemoteMemoryDescriptor& remote, uint64_t offset,
                                           uint64_t length, absl::string_view what, bool cache) {
  if (remote.backend() != v1::TRANSFER_BACKEND_UCX) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": remote descriptor is for backend ", remote.backend(), ", not UCX"));
  }
  const std::string& packed = remote.packed_rkey();
  if (packed.size() <= kRkeyHeader || std::memcmp(packed.data(), kRkeyMagic, 4) != 0 ||
      ReadU64(packed.data() + 20) != Hash64(packed.data() + kRkeyHeader, packed.size() - kRkeyHeader)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": unknown remote key (malformed)"));
  }
  const uint64_t owner = ReadU64(packed.data() + 4);
  const uint64_t registration = ReadU64(packed.data() + 12);
  if (owner != peer->instance) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": stale or foreign remote key: it belongs to transport ",
                                                      absl::Hex(owner), ", the peer is ", absl::Hex(peer->instance),
                                                      " (restarted?)"));
  }
  if (registration != remote.registration_id()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": remote key does not match registration_id ", remote.registration_id()));
  }
  if (peer->revoked.count(registration)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": stale remote key: registration ", registration, " was deregistered by its owner"));
  }
  RETURN_IF_ERROR(CheckRange(absl::StrCat(what, " remote range"), offset, length, remote.length_bytes()));
  auto it = peer->rkeys.find(registration);
  if (cache && it != peer->rkeys.end()) return it->second;
  if (!PackedRkeyFits(packed.data() + kRkeyHeader, packed.size() - kRkeyHeader)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": remote key for registration ", registration, " is malformed (its parts overrun it)"));
  }
  ucp_rkey_h rkey = nullptr;
  RETURN_IF_ERROR(UCS_STATUS(ucp_ep_rkey_unpack(peer->ep, packed.data() + kRkeyHeader, &rkey),
                             absl::StrCat(what, ": ucp_ep_rkey_unpack")));
  if (cache) peer->rkeys[registration] = rkey;
  return rkey;
}

namespace {

// A transfer's completion whose Wait drives the worker itself instead of waking up
// after the progress thread finished it: one thread hand-off less per transfer.
class UcxCompletion : public Completion {
 public:
  UcxCompletion(Impl* impl, std::shared_ptr<PendingCompletion> pending) : impl_(impl), pending_(std::move(pending)) {}

  absl::Status Wait(absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    impl_->waiters_.fetch_add(1);
    int idle = 0;
    while (!pending_->Done() && absl::Now() < deadline) {
      bool did = false;
      if (impl_->worker_mu_.TryLock()) {
        did = impl_->DriveLocked();
        impl_->worker_mu_.Unlock();
      }
      if (did) {
        idle = 0;
      } else if (++idle < kWaitSpins) {
        sched_yield();
      } else {
        // Nothing moves (a slow or silent peer): let the progress thread take over and
        // sleep on the completion for a moment.
        impl_->waiters_.fetch_sub(1);
        (void)pending_->Wait(std::min(absl::Milliseconds(1), deadline - absl::Now()));
        impl_->waiters_.fetch_add(1);
        idle = 0;
      }
    }
    impl_->waiters_.fetch_sub(1);
    if (!pending_->Done()) {
      return absl::DeadlineExceededError(absl::StrCat("transfer not finished after ", absl::FormatDuration(timeout)));
    }
    return pending_->Wait(absl::ZeroDuration());
  }
  bool Done() override { return pending_->Done(); }
  uint64_t bytes() override { return pending_->bytes(); }
  // A posted receive is cancelled (its callback finishes it CANCELLED); the rest runs on.
  void Cancel() override {
    if (pending_->Done()) return;
    absl::MutexLock lock(&impl_->worker_mu_);
    // (Collected first: a cancelled request's callback may run at once and delete its op.)
    std::vector<void*> requests;
    for (Impl::Op* op : impl_->ops_) {
      if (op->completion == pending_ && op->is_recv && op->request != nullptr) requests.push_back(op->request);
    }
    for (void* request : requests) ucp_request_cancel(impl_->worker_, request);
  }

 private:
  static constexpr int kWaitSpins = 2000;
  Impl* const impl_;
  std::shared_ptr<PendingCompletion> pending_;
};

}  // namespace

std::unique_ptr<Completion> Impl::Submit(std::function<void(Op*)> start) {
  auto completion = std::make_shared<PendingCompletion>();
  auto* op = new Op;
  op->impl = this;
  op->completion = completion;
  const absl::Time asked = absl::Now();
  {
    absl::MutexLock lock(&worker_mu_);
    const absl::Time got = absl::Now();
    ops_.insert(op);
    start(op);
    ReportSlow("a transfer's start", got - asked, absl::Now() - got);
  }
  return std::make_unique<UcxCompletion>(this, completion);
}

}  // namespace rlfleet::transport

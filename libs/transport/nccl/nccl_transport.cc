#include "libs/transport/nccl/nccl_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <list>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/common/status_macros.h"
#include "libs/metrics/metrics.h"

namespace rlfleet::transport {
namespace {

// Every NCCL and CUDA result becomes an absl::Status here, with the call and file:line.
absl::Status NcclStatus(ncclResult_t r, const char* call, const char* file, int line) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  const std::string message = absl::StrCat(call, ": ", ncclGetErrorString(r), " (", file, ":", line, ")");
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}
absl::Status CudaStatus(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(call, ": ", cudaGetErrorString(e), " (", file, ":", line, ")");
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    return absl::FailedPreconditionError(message);
  }
  return absl::InternalError(message);
}
#define NCCL_STATUS(call) NcclStatus((call), #call, __FILE__, __LINE__)
#define CUDA_STATUS(call) CudaStatus((call), #call, __FILE__, __LINE__)

constexpr absl::Duration kPoll = absl::Microseconds(100);

}  // namespace

class NcclTransport::Impl {
 public:
  // Per-collective metrics in the process's registry (served at /metrics):
  // rlfleet_nccl_op_seconds{op} from submission to completion on the GPU,
  // rlfleet_nccl_bytes_total{op} and rlfleet_nccl_errors_total{op}.
  struct OpMetrics {
    explicit OpMetrics(const std::string& op)
        : seconds(metrics::Global().AddHistogram(
              "rlfleet_nccl_op_seconds", "NCCL operation time, submission to completion on the GPU.", {{"op", op}})),
          bytes(metrics::Global().AddCounter("rlfleet_nccl_bytes_total", "Bytes NCCL operations moved.", {{"op", op}})),
          errors(metrics::Global().AddCounter("rlfleet_nccl_errors_total", "NCCL operations that failed.",
                                              {{"op", op}})) {}
    metrics::Histogram* seconds;
    metrics::Counter* bytes;
    metrics::Counter* errors;
  };

  struct Pending {
    cudaEvent_t event = nullptr;  // null until the op is enqueued
    std::shared_ptr<PendingCompletion> completion;
    absl::Time submitted, deadline;
    uint64_t bytes = 0;
    OpMetrics* metrics = nullptr;
  };

  explicit Impl(NcclOptions options) : options_(std::move(options)) {}
  ~Impl() { Close(); }

  absl::Status Init();
  void Close();

  // Waits for a non-blocking NCCL call to settle; aborts the communicator past `deadline`.
  absl::Status Settle(ncclResult_t result, const char* what, absl::Time deadline);
  void Abort(const absl::Status& why);
  void Watch();

  absl::StatusOr<uint8_t*> Resolve(const MemoryHandle& h, uint64_t offset, uint64_t length, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  // Enqueues `enqueue` (NCCL calls on stream_) and tracks its completion.
  std::unique_ptr<Completion> Submit(OpMetrics& op, uint64_t bytes, const std::function<absl::Status()>& enqueue);

  OpMetrics send_recv_metrics_{"send_recv"};  // grouped Send / Recv
  OpMetrics broadcast_metrics_{"broadcast"};

  const NcclOptions options_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;

  absl::Mutex submit_mu_;  // serialises NCCL enqueues and the registration table
  std::map<uint64_t, MemoryHandle> registrations_ ABSL_GUARDED_BY(submit_mu_);
  std::set<uint64_t> owned_ ABSL_GUARDED_BY(submit_mu_);
  uint64_t next_registration_ ABSL_GUARDED_BY(submit_mu_) = 1;

  absl::Mutex pending_mu_;
  std::list<Pending> pending_ ABSL_GUARDED_BY(pending_mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(pending_mu_);  // non-OK once aborted
  bool stop_ ABSL_GUARDED_BY(pending_mu_) = false;
  std::thread watchdog_;
};

using Impl = NcclTransport::Impl;

absl::Status Impl::Init() {
  if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options_.rank, " / world_size ", options_.world_size, " is not a valid rank"));
  }
  if (options_.unique_id.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unique_id is ", options_.unique_id.size(), " bytes; NCCL ids are ", sizeof(ncclUniqueId)));
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError("no CUDA device: the NCCL backend needs a GPU");
  }
  if (options_.device < 0 || options_.device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("device ", options_.device, " of ", devices));
  }
  RETURN_IF_ERROR(CUDA_STATUS(cudaSetDevice(options_.device)));
  if (options_.cuda_stream != nullptr) {
    stream_ = static_cast<cudaStream_t>(options_.cuda_stream);
  } else {
    RETURN_IF_ERROR(CUDA_STATUS(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)));
  }
  ncclUniqueId id;
  std::memcpy(&id, options_.unique_id.data(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every NCCL call returns at once; we wait with a deadline
  const absl::Time deadline = absl::Now() + options_.init_timeout;
  ncclResult_t r = ncclCommInitRankConfig(&comm_, options_.world_size, id, options_.rank, &config);
  absl::Status s = Settle(r, "ncclCommInitRankConfig", deadline);
  if (!s.ok()) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(
          absl::StrCat("NCCL communicator init: not every one of ", options_.world_size, " ranks joined within ",
                       absl::FormatDuration(options_.init_timeout), " (communicator aborted)"));
    }
    return s;
  }
  watchdog_ = std::thread([this] { Watch(); });
  return absl::OkStatus();
}

absl::Status Impl::Settle(ncclResult_t result, const char* what, absl::Time deadline) {
  if (result != ncclSuccess && result != ncclInProgress) return NcclStatus(result, what, __FILE__, __LINE__);
  if (comm_ == nullptr) return absl::OkStatus();
  ncclResult_t state = result;
  while (state == ncclInProgress) {
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
    if (state != ncclInProgress) break;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, " did not finish in time"));
    }
    absl::SleepFor(kPoll);
  }
  return NcclStatus(state, what, __FILE__, __LINE__);
}

void Impl::Abort(const absl::Status& why) {
  std::list<Pending> failed;
  {
    absl::MutexLock lock(&pending_mu_);
    if (!aborted_.ok()) return;
    aborted_ = absl::UnavailableError(absl::StrCat("NCCL communicator aborted: ", why.message()));
    failed.swap(pending_);
  }
  // Fail the waiters first: ncclCommAbort can block until work queued on the stream
  // ahead of NCCL's drains, and nobody should wait for that.
  for (Pending& p : failed) {
    if (p.metrics != nullptr) p.metrics->errors->Add();
    p.completion->Finish(absl::UnavailableError(absl::StrCat("NCCL communicator aborted: ", why.message())), 0);
  }
  ncclCommAbort(comm_);  // makes kernels waiting on a dead rank give up
  for (Pending& p : failed) {
    if (p.event != nullptr) cudaEventDestroy(p.event);
  }
}

void Impl::Watch() {
  cudaSetDevice(options_.device);
  for (;;) {
    absl::Status abort_reason;
    {
      absl::MutexLock lock(&pending_mu_);
      if (stop_ || !aborted_.ok()) return;
      const absl::Time now = absl::Now();
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->event != nullptr) {
          const cudaError_t q = cudaEventQuery(it->event);
          if (q == cudaSuccess) {
            it->metrics->seconds->Observe(absl::ToDoubleSeconds(now - it->submitted));
            it->metrics->bytes->Add(static_cast<double>(it->bytes));
            it->completion->Finish(absl::OkStatus(), it->bytes);
            cudaEventDestroy(it->event);
            it = pending_.erase(it);
            continue;
          }
          if (q != cudaErrorNotReady) {
            abort_reason = CUDA_STATUS(q);
            break;
          }
        }
        if (now >= it->deadline) {
          abort_reason = absl::DeadlineExceededError(absl::StrCat("an operation ran past its ",
                                                                  absl::FormatDuration(options_.op_timeout),
                                                                  " deadline (a peer rank is dead or stuck)"));
          break;
        }
        ++it;
      }
    }
    ncclResult_t async = ncclSuccess;
    if (abort_reason.ok() && ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      abort_reason = NCCL_STATUS(async);
    }
    if (!abort_reason.ok()) {
      Abort(abort_reason);
      return;
    }
    absl::SleepFor(kPoll);
  }
}

void Impl::Close() {
  {
    absl::MutexLock lock(&pending_mu_);
    stop_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  bool aborted;
  {
    absl::MutexLock lock(&pending_mu_);
    aborted = !aborted_.ok();
    for (Pending& p : pending_) {
      p.completion->Finish(absl::UnavailableError("NCCL transport closed"), 0);
      if (p.event != nullptr) cudaEventDestroy(p.event);
    }
    pending_.clear();
  }
  if (comm_ != nullptr) {
    if (aborted) {
      // ncclCommAbort already released it.
    } else if (stream_ != nullptr && cudaStreamQuery(stream_) == cudaErrorNotReady) {
      ncclCommAbort(comm_);  // work still queued: do not wait for it
    } else {
      ncclCommDestroy(comm_);
    }
    comm_ = nullptr;
  }
  absl::MutexLock lock(&submit_mu_);
  for (uint64_t id : owned_) cudaFree(registrations_[id].base);
  owned_.clear();
  registrations_.clear();
  if (stream_ != nullptr && options_.cuda_stream == nullptr) cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

absl::StatusOr<uint8_t*> Impl::Resolve(const MemoryHandle& h, uint64_t offset, uint64_t length,
                                       absl::string_view what) {
  auto it = registrations_.find(h.id);
  if (it == registrations_.end() || it->second.base != h.base) {
    return absl::NotFoundError(
        absl::StrCat(what, ": memory registration ", h.id, " is not registered (deregistered?)"));
  }
  RETURN_IF_ERROR(CheckRange(what, offset, length, it->second.length));
  return static_cast<uint8_t*>(it->second.base) + offset;
}

std::unique_ptr<Completion> Impl::Submit(OpMetrics& op, uint64_t bytes, const std::function<absl::Status()>& enqueue) {
  auto completion = std::make_shared<PendingCompletion>();
  {
    absl::MutexLock lock(&pending_mu_);
    if (!aborted_.ok()) return CompletedWith(aborted_);
  }
  cudaSetDevice(options_.device);
  const absl::Time submitted = absl::Now();
  absl::Status s = enqueue();
  if (!s.ok()) {
    op.errors->Add();
    if (absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s)) {
      // Stuck in NCCL (a peer rank is gone): the communicator is aborted, and that
      // is what the caller hears, like every other operation on it from now on.
      Abort(s);
      absl::MutexLock lock(&pending_mu_);
      return CompletedWith(aborted_);
    }
    return CompletedWith(s);
  }
  Pending p;
  p.completion = completion;
  p.submitted = submitted;
  p.deadline = absl::Now() + options_.op_timeout;
  p.bytes = bytes;
  p.metrics = &op;
  s = CUDA_STATUS(cudaEventCreateWithFlags(&p.event, cudaEventDisableTiming));
  if (s.ok()) s = CUDA_STATUS(cudaEventRecord(p.event, stream_));
  if (!s.ok()) return CompletedWith(s);
  absl::MutexLock lock(&pending_mu_);
  if (!aborted_.ok()) {
    cudaEventDestroy(p.event);
    return CompletedWith(aborted_);
  }
  pending_.push_back(std::move(p));
  return Share(completion);
}

// ---- NcclTransport ----

absl::StatusOr<std::string> NcclTransport::NewUniqueId() {
  ncclUniqueId id;
  RETURN_IF_ERROR(NCCL_STATUS(ncclGetUniqueId(&id)));
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(const NcclOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<NcclTransport>(new NcclTransport(std::move(impl)));
}

NcclTransport::NcclTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclTransport::~NcclTransport() = default;

int NcclTransport::rank() const { return impl_->options_.rank; }
int NcclTransport::world_size() const { return impl_->options_.world_size; }

Capabilities NcclTransport::GetCapabilities() const {
  Capabilities caps;
  caps.backend = "nccl";
  caps.cuda_memory = true;
  caps.two_sided = true;
  caps.max_message_bytes = uint64_t{1} << 40;
  int version = 0;
  ncclGetVersion(&version);
  caps.detail =
      absl::StrCat("NCCL ", version, ", rank ", rank(), " of ", world_size(), ", device ", impl_->options_.device);
  return caps;
}

std::string NcclTransport::LocalAddress() const { return absl::StrCat("nccl:", rank()); }

absl::StatusOr<PeerId> NcclTransport::Connect(absl::string_view peer_address) {
  int peer_rank = -1;
  absl::string_view rest = peer_address;
  if (!absl::ConsumePrefix(&rest, "nccl:") || !absl::SimpleAtoi(rest, &peer_rank) || peer_rank < 0 ||
      peer_rank >= world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("`", peer_address, "` is not nccl:<rank> with rank < ", world_size()));
  }
  return static_cast<PeerId>(peer_rank) + 1;
}

absl::StatusOr<MemoryHandle> NcclTransport::RegisterMemory(void* base, uint64_t length, MemoryKind kind, int device) {
  if (base == nullptr) return absl::InvalidArgumentError("RegisterMemory: null base address");
  if (length == 0) return absl::InvalidArgumentError("RegisterMemory: zero length");
  if (kind != MemoryKind::kCuda) {
    return absl::InvalidArgumentError("the NCCL backend moves CUDA device memory only");
  }
  absl::MutexLock lock(&impl_->submit_mu_);
  MemoryHandle h{impl_->next_registration_++, base, length, kind, device};
  impl_->registrations_[h.id] = h;
  return h;
}

absl::StatusOr<MemoryHandle> NcclTransport::AllocateMemory(uint64_t length, MemoryKind kind, int device) {
  if (length == 0) return absl::InvalidArgumentError("AllocateMemory: zero length");
  (void)kind;
  cudaSetDevice(impl_->options_.device);
  void* base = nullptr;
  RETURN_IF_ERROR(CUDA_STATUS(cudaMalloc(&base, length)));
  auto h = RegisterMemory(base, length, MemoryKind::kCuda, impl_->options_.device);
  if (!h.ok()) {
    cudaFree(base);
    return h.status();
  }
  (void)device;
  absl::MutexLock lock(&impl_->submit_mu_);
  impl_->owned_.insert(h->id);
  return h;
}

absl::Status NcclTransport::DeregisterMemory(const MemoryHandle& handle) {
  absl::MutexLock lock(&impl_->submit_mu_);
  auto it = impl_->registrations_.find(handle.id);
  if (it == impl_->registrations_.end()) {
    return absl::NotFoundError(absl::StrCat("memory registration ", handle.id, " is not registered"));
  }
  if (impl_->owned_.erase(handle.id)) {
    cudaStreamSynchronize(impl_->stream_);  // nothing queued may still use it
    cudaFree(it->second.base);
  }
  impl_->registrations_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<v1::RemoteMemoryDescriptor> NcclTransport::Describe(const MemoryHandle& handle) {
  absl::MutexLock lock(&impl_->submit_mu_);
  auto it = impl_->registrations_.find(handle.id);
  if (it == impl_->registrations_.end()) {
    return absl::NotFoundError(absl::StrCat("memory registration ", handle.id, " is not registered"));
  }
  v1::RemoteMemoryDescriptor d;
  d.set_backend(v1::TRANSFER_BACKEND_NCCL);
  d.set_worker_address(LocalAddress());
  d.set_base_address(reinterpret_cast<uint64_t>(it->second.base));
  d.set_length_bytes(it->second.length);
  d.set_memory_kind(v1::MEMORY_KIND_CUDA);
  d.set_device_index(impl_->options_.device);
  d.set_registration_id(handle.id);
  return d;
}

std::unique_ptr<Completion> NcclTransport::Put(PeerId, const MemoryHandle&, uint64_t, const v1::RemoteMemoryDescriptor&,
                                               uint64_t, uint64_t) {
  return CompletedWith(absl::UnimplementedError("the NCCL backend has no one-sided Put; use Send/Recv"));
}

std::unique_ptr<Completion> NcclTransport::Get(PeerId, const MemoryHandle&, uint64_t, const v1::RemoteMemoryDescriptor&,
                                               uint64_t, uint64_t) {
  return CompletedWith(absl::UnimplementedError("the NCCL backend has no one-sided Get; use Send/Recv"));
}

std::unique_ptr<Completion> NcclTransport::Send(PeerId peer, uint64_t /*tag*/, const MemoryHandle& local,
                                                uint64_t offset, uint64_t length) {
  return Grouped({GroupedOp{true, peer, local, offset, length}});
}

std::unique_ptr<Completion> NcclTransport::Recv(PeerId peer, uint64_t /*tag*/, const MemoryHandle& local,
                                                uint64_t offset, uint64_t capacity) {
  return Grouped({GroupedOp{false, peer, local, offset, capacity}});
}

std::unique_ptr<Completion> NcclTransport::SendRecvBatch(const std::vector<TwoSidedOp>& ops) {
  std::vector<GroupedOp> grouped;
  grouped.reserve(ops.size());
  for (const TwoSidedOp& op : ops) {
    grouped.push_back(GroupedOp{op.send, op.peer, op.memory, op.offset, op.length});
  }
  return Grouped(grouped);
}

std::unique_ptr<Completion> NcclTransport::Grouped(const std::vector<GroupedOp>& ops) {
  Impl* impl = impl_.get();
  absl::MutexLock lock(&impl->submit_mu_);
  std::vector<std::pair<uint8_t*, const GroupedOp*>> resolved;
  uint64_t bytes = 0;
  for (const GroupedOp& op : ops) {
    if (op.peer < 1 || op.peer > static_cast<PeerId>(world_size())) {
      return CompletedWith(absl::NotFoundError(absl::StrCat("unknown peer id ", op.peer)));
    }
    auto ptr = impl->Resolve(op.memory, op.offset, op.length, op.send ? "Send" : "Recv");
    if (!ptr.ok()) return CompletedWith(ptr.status());
    resolved.emplace_back(*ptr, &op);
    bytes += op.length;
  }
  return impl->Submit(impl->send_recv_metrics_, bytes, [&]() -> absl::Status {
    const absl::Time deadline = absl::Now() + impl->options_.op_timeout;
    RETURN_IF_ERROR(NCCL_STATUS(ncclGroupStart()));
    for (auto& [ptr, op] : resolved) {
      const int peer_rank = static_cast<int>(op->peer - 1);
      ncclResult_t r = op->send ? ncclSend(ptr, op->length, ncclUint8, peer_rank, impl->comm_, impl->stream_)
                                : ncclRecv(ptr, op->length, ncclUint8, peer_rank, impl->comm_, impl->stream_);
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclGroupEnd();
        return NCCL_STATUS(r);
      }
    }
    return impl->Settle(ncclGroupEnd(), "ncclGroupEnd", deadline);
  });
}

std::unique_ptr<Completion> NcclTransport::Broadcast(int root, const MemoryHandle& send, uint64_t send_offset,
                                                     const MemoryHandle& recv, uint64_t recv_offset, uint64_t length) {
  if (root < 0 || root >= world_size()) {
    return CompletedWith(absl::InvalidArgumentError(absl::StrCat("Broadcast: root ", root, " of ", world_size())));
  }
  Impl* impl = impl_.get();
  absl::MutexLock lock(&impl->submit_mu_);
  uint8_t* src = nullptr;
  if (rank() == root) {
    auto p = impl->Resolve(send, send_offset, length, "Broadcast send");
    if (!p.ok()) return CompletedWith(p.status());
    src = *p;
  }
  auto dst = impl->Resolve(recv, recv_offset, length, "Broadcast recv");
  if (!dst.ok()) return CompletedWith(dst.status());
  return impl->Submit(impl->broadcast_metrics_, length, [&]() -> absl::Status {
    const absl::Time deadline = absl::Now() + impl->options_.op_timeout;
    return impl->Settle(ncclBroadcast(src, *dst, length, ncclUint8, root, impl->comm_, impl->stream_), "ncclBroadcast",
                        deadline);
  });
}

}  // namespace rlfleet::transport

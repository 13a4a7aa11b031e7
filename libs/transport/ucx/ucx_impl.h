// Private to the UCX backend: the state behind UcxTransport (its pimpl) and the
// helpers shared by ucx_worker.cc (the worker, progress, peers, control messages) and
// ucx_transport.cc (the public operations). Nothing outside libs/transport/ucx
// includes it.
#ifndef RLFLEET_LIBS_TRANSPORT_UCX_UCX_IMPL_H_
#define RLFLEET_LIBS_TRANSPORT_UCX_UCX_IMPL_H_

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "libs/common/hmac.h"
#include "libs/common/status_macros.h"
#include "libs/transport/ucx/ucx_transport.h"

namespace rlfleet::transport {
namespace ucx_internal {

// Every UCX status becomes an absl::Status here, with the call and file:line.
inline absl::Status UcsStatus(ucs_status_t s, absl::string_view what, const char* file, int line) {
  if (s == UCS_OK) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", ucs_status_string(s), " (", file, ":", line, ")");
  switch (s) {
    case UCS_ERR_MESSAGE_TRUNCATED:
      return absl::DataLossError(message);
    case UCS_ERR_CANCELED:
      return absl::CancelledError(message);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
      return absl::ResourceExhaustedError(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return absl::InvalidArgumentError(message);
    case UCS_ERR_UNSUPPORTED:
      return absl::UnimplementedError(message);
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_BUSY:
    case UCS_ERR_NO_DEVICE:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}
#define UCS_STATUS(s, what) UcsStatus((s), (what), __FILE__, __LINE__)

constexpr char kAddressMagic[8] = {'R', 'L', 'F', 'U', 'C', 'X', '1', 0};
constexpr char kRkeyMagic[4] = {'R', 'F', 'K', '1'};
constexpr size_t kRkeyHeader = 4 + 8 + 8 + 8;  // magic, owner instance, registration, hash
constexpr uint64_t kMaxUserTag = 0xffffffffull;
constexpr int kIdleSpins = 20000;

enum AmId : uint16_t { kAmHello = 1, kAmRevoke = 2, kAmRevokeAck = 3 };

inline uint64_t Hash64(const void* data, size_t n) {  // FNV-1a
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

constexpr size_t kAddressHeader = 8 + 8 + 8 + 8;  // magic, instance, pid, host hash
constexpr absl::Duration kLivenessInterval = absl::Milliseconds(100);

// Which peers are on this host (same kernel and network namespace: shared memory and
// a pid to watch): the host name and this process's network namespace. Processes of
// one machine in other namespaces (containers, test hosts) are other hosts: UCX's
// peer-failure handling (keepalive) watches them, as it does real remote hosts.
inline uint64_t HostHash() {
  char host[512] = {0};
  gethostname(host, 255);
  const size_t n = strlen(host);
  const ssize_t ns = readlink("/proc/self/ns/net", host + n, sizeof(host) - n - 1);
  return Hash64(host, n + (ns > 0 ? static_cast<size_t>(ns) : 0));
}

inline void AppendU64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }
inline uint64_t ReadU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace ucx_internal

using namespace ucx_internal;  // NOLINT: private header of one backend

class UcxTransport::Impl {
 public:
  struct Peer;

  // One in-flight UCX operation. Owned by the progress thread; deleted when finished.
  struct Op {
    Impl* impl = nullptr;
    std::shared_ptr<PendingCompletion> completion;
    Peer* peer = nullptr;
    uint64_t bytes = 0;
    int parts = 1;            // UCX requests still to complete (put = put + flush)
    absl::Status status;      // first error
    absl::Status override;    // replaces CANCELLED when we cancel (peer died, shutdown)
    void* request = nullptr;  // receive request, for cancellation
    bool is_recv = false;
    // Inside ucp_tag_recv_nbx: with UCP_OP_ATTR_FLAG_NO_IMM_CMPL, UCX 1.13 calls back
    // from inside the call when the message is already there. FinishPart then leaves the
    // op to its poster (finished = true), which frees it after the call returns.
    bool posting = false;
    bool finished = false;
    std::vector<uint64_t> rkey_registrations;  // remote registrations in use (Put / Get)
  };

  struct Peer {
    Impl* impl = nullptr;
    PeerId id = 0;
    uint64_t instance = 0;
    uint32_t tag_id = 0;
    std::string address;
    ucp_ep_h ep = nullptr;
    pid_t pid = 0;
    bool watch_pid = false;          // liveness by pid (no UCX peer-failure handling)
    bool peer_failure_mode = false;  // endpoint created with UCP_ERR_HANDLING_MODE_PEER
    bool failed = false;
    // It let a revoke time out (hung or stopped, yet connected): later revokes are
    // still sent to it but do not wait for its ack (each used to wait revoke_timeout,
    // so every version a trainer or relay retired cost 5 s) until it acks one again.
    bool unresponsive = false;
    absl::Status error;
    std::map<uint64_t, ucp_rkey_h> rkeys;  // remote registration id -> unpacked key
    std::set<uint64_t> revoked;
    std::map<uint64_t, int> inflight;                         // remote registration id -> Put/Get in flight
    std::map<uint64_t, std::vector<uint64_t>> deferred_acks;  // registration -> revoke seqs
    std::set<Op*> recvs;
  };

  struct Registration {
    MemoryHandle handle;
    ucp_mem_h memh = nullptr;
    std::string packed_rkey;  // framed
    // Whether its descriptor (remote key) ever left this process: memory never
    // described cannot be in use by a peer, so deregistering it needs no revoke round.
    bool described = false;
  };

  struct RevokeWait {
    uint64_t seq = 0;
    std::set<uint64_t> waiting;  // peer instances that have not acknowledged
    absl::Notification done;
  };

  explicit Impl(UcxOptions options) : options_(std::move(options)) {}

  absl::Status Init();
  void Shutdown();

  // Runs `fn` with the worker lock held (on the calling thread) and returns its result.
  // `what` names it in the report of a slow one (ReportSlow).
  template <typename T>
  absl::StatusOr<T> RunSync(std::function<absl::StatusOr<T>()> fn, const char* what = "a call") {
    const absl::Time asked = absl::Now();
    absl::MutexLock lock(&worker_mu_);
    const absl::Time got = absl::Now();
    absl::StatusOr<T> out = fn();
    ReportSlow(what, got - asked, absl::Now() - got);
    return out;
  }
  // Every UCX operation of the process passes the worker lock, so one call that blocks
  // in it holds up every transfer: a call that waited for it or held it longer than
  // kSlowWorker is said on stderr (what, how long, which peer stands out is for the
  // reader of the log), once per kind per minute at most.
  void ReportSlow(const char* what, absl::Duration waited, absl::Duration held);

  void Post(std::function<void()> task) {
    {
      absl::MutexLock lock(&mu_);
      tasks_.push_back(std::move(task));
    }
    Wake();
  }
  // Wakes the progress loop from its sleep.
  void Wake() {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  // ---- everything below runs with worker_mu_ held ----
  // Runs deferred tasks and progresses the worker; true if anything happened.
  bool DriveLocked();
  void Loop();
  absl::StatusOr<PeerId> ConnectOnThread(const std::string& address, bool send_hello);
  void OnPeerError(Peer* peer, ucs_status_t status);
  void CheckLiveness();
  void FailPeer(Peer* peer);
  void SendAm(Peer* peer, AmId id, std::string payload);
  void HandleRevoke(uint64_t owner, uint64_t registration, uint64_t seq);
  void HandleRevokeAck(uint64_t from_instance, uint64_t seq);
  void ReleaseRkeyIfIdle(Peer* peer, uint64_t registration);
  void FinishPart(Op* op, absl::Status status);
  absl::StatusOr<std::pair<Peer*, uint8_t*>> Resolve(PeerId peer, const MemoryHandle& local, uint64_t offset,
                                                     uint64_t length, absl::string_view what);
  // The peer's remote key for `remote` after checking it (owner, revocation, range):
  // cached per peer and destroyed on revocation, or (cache = false) a fresh one the
  // caller owns and destroys.
  absl::StatusOr<ucp_rkey_h> RemoteKey(Peer* peer, const v1::RemoteMemoryDescriptor& remote, uint64_t offset,
                                       uint64_t length, absl::string_view what, bool cache = true);
  std::unique_ptr<Completion> Submit(std::function<void(Op*)> start);

  static void OnSend(void* request, ucs_status_t status, void* user_data);
  static void OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                           const ucp_am_recv_param_t* param);

  const UcxOptions options_;
  std::atomic<uint64_t> rejected_control_{0};  // control messages without a valid MAC
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string local_address_;
  uint64_t instance_ = 0;
  uint32_t tag_id_ = 0;
  Capabilities caps_;
  bool tcp_only_ = false;  // UCX_TLS names tcp (and self) only

  // Progress-thread state (guarded by worker_mu_).
  std::map<PeerId, std::unique_ptr<Peer>> peers_;
  std::map<uint64_t, Peer*> by_instance_;
  // Peers that connected to us (hello) but that we have no endpoint to yet.
  std::map<uint64_t, std::string> hello_addresses_;
  std::map<uint64_t, Registration> registrations_;
  std::set<uint64_t> owned_;  // registrations whose memory AllocateMemory allocated
  std::map<uint64_t, std::shared_ptr<RevokeWait>> revokes_;
  std::set<Op*> ops_;
  PeerId next_peer_ = 1;
  uint64_t next_registration_ = 1;
  uint64_t next_seq_ = 1;
  bool stop_ = false;
  absl::Time last_liveness_check_ = absl::InfinitePast();

  // Held by whichever thread touches UCX: the progress thread, or an API thread that
  // submits a transfer or drives progress while it waits (UCS_THREAD_MODE_SERIALIZED).
  // Every field above marked "progress-thread state" is guarded by it.
  absl::Mutex worker_mu_;
  // Threads inside Completion::Wait driving progress; the progress thread stands back.
  std::atomic<int> waiters_{0};
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  int wake_fd_ = -1;
  std::thread thread_;
};

using Impl = UcxTransport::Impl;

}  // namespace rlfleet::transport

#endif  // RLFLEET_LIBS_TRANSPORT_UCX_UCX_IMPL_H_

// A decorator over any Transport that injects faults, for reliability tests
// (Mooncake's fault_proxy_transport, LevelDB's FaultInjectionTestEnv): it delays,
// drops, corrupts or fails transfers according to a FaultPlan that tests may change
// at any time. Registration, description and connection pass straight through.
//
//   FaultTransport t(LoopbackTransport::Create(), FaultPlan{.fail_after = 3});
//
// Thread-safe.
#ifndef RLFLEET_LIBS_TRANSPORT_FAULT_FAULT_TRANSPORT_H_
#define RLFLEET_LIBS_TRANSPORT_FAULT_FAULT_TRANSPORT_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "libs/transport/forwarding_transport.h"

namespace rlfleet::transport {

struct FaultPlan {
  // Every transfer completes no sooner than this after submission.
  absl::Duration delay = absl::ZeroDuration();
  // With > 0, a slow link: every transfer also takes its length / bytes_per_second
  // (on top of `delay`, which is then the link's latency).
  double bytes_per_second = 0;
  // Probability that a transfer is silently lost: never submitted, never completes
  // (Wait returns DEADLINE_EXCEEDED), like a message into a black hole.
  double drop_probability = 0;
  // Probability that one byte of a transfer's data is flipped: in the received bytes
  // for Recv / Get, in the bytes that leave for Send / Put (the caller's buffer is
  // left intact).
  double corrupt_probability = 0;
  // Transfers after the first `fail_after` fail at once with UNAVAILABLE; -1 = never.
  int64_t fail_after = -1;
  uint64_t seed = 1;
};

struct FaultCounters {
  uint64_t transfers = 0;
  uint64_t delayed = 0;
  uint64_t dropped = 0;
  uint64_t corrupted = 0;
  uint64_t failed = 0;
};

class FaultTransport : public ForwardingTransport {
 public:
  FaultTransport(std::unique_ptr<Transport> inner, FaultPlan plan = {});

  void SetPlan(const FaultPlan& plan);
  FaultCounters counters();

  Capabilities GetCapabilities() const override;
  std::unique_ptr<Completion> Put(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                  const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                  uint64_t length) override;
  std::unique_ptr<Completion> Get(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                  const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                  uint64_t length) override;
  std::unique_ptr<Completion> Send(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                   uint64_t length) override;
  std::unique_ptr<Completion> Recv(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                   uint64_t capacity) override;
  // Batches go op by op through the faulty Put / Send / Recv above (Transport's
  // defaults), and a peer's memory is never mapped past the faults.
  std::unique_ptr<Completion> PutBatch(PeerId peer, const std::vector<PutOp>& ops) override {
    return Transport::PutBatch(peer, ops);
  }
  std::unique_ptr<Completion> SendRecvBatch(const std::vector<TwoSidedOp>& ops) override {
    return Transport::SendRecvBatch(ops);
  }
  absl::StatusOr<std::unique_ptr<RemoteMapping>> MapRemote(PeerId peer,
                                                           const v1::RemoteMemoryDescriptor& remote) override {
    return Transport::MapRemote(peer, remote);
  }

 private:
  enum class Fate { kPass, kDrop, kFail, kCorrupt };
  struct Decision {
    Fate fate = Fate::kPass;
    absl::Duration delay;
    uint64_t corrupt_at = 0;  // byte index within the transfer, for kCorrupt
  };
  // Decides what happens to the next transfer of `length` bytes.
  Decision Decide(uint64_t length);
  // Applies drop / fail up front; returns null when the transfer should go ahead.
  std::unique_ptr<Completion> Intercept(const Decision& d);
  std::unique_ptr<Completion> Delayed(std::unique_ptr<Completion> inner, absl::Duration delay);
  // Send / Put of a corrupted copy of local[offset, +length).
  std::unique_ptr<Completion> CorruptOutbound(
      const MemoryHandle& local, uint64_t offset, uint64_t length, uint64_t corrupt_at,
      const std::function<std::unique_ptr<Completion>(const MemoryHandle&)>& submit);

  absl::Mutex mu_;
  FaultPlan plan_ ABSL_GUARDED_BY(mu_);
  FaultCounters counters_ ABSL_GUARDED_BY(mu_);
  absl::BitGen gen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlfleet::transport

#endif  // RLFLEET_LIBS_TRANSPORT_FAULT_FAULT_TRANSPORT_H_

#include "libs/transport/fault/fault_transport.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace rlfleet::transport {
namespace {

// Completes no sooner than `not_before`, then reports the inner completion.
class DelayedCompletion : public Completion {
 public:
  DelayedCompletion(std::unique_ptr<Completion> inner, absl::Time not_before)
      : inner_(std::move(inner)), not_before_(not_before) {}
  absl::Status Wait(absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    if (not_before_ > deadline) {
      absl::SleepFor(deadline - absl::Now());
      return absl::DeadlineExceededError("transfer delayed by fault injection");
    }
    absl::SleepFor(not_before_ - absl::Now());
    return inner_->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
  }
  bool Done() override { return absl::Now() >= not_before_ && inner_->Done(); }
  uint64_t bytes() override { return inner_->bytes(); }

 private:
  std::unique_ptr<Completion> inner_;
  const absl::Time not_before_;
};

// Flips one byte of `target` once the inner (receiving) transfer succeeded.
class CorruptingCompletion : public Completion {
 public:
  CorruptingCompletion(std::unique_ptr<Completion> inner, uint8_t* target)
      : inner_(std::move(inner)), target_(target) {}
  absl::Status Wait(absl::Duration timeout) override {
    absl::Status status = inner_->Wait(timeout);
    absl::MutexLock lock(&mu_);
    if (status.ok() && !flipped_) {
      *target_ ^= 0x5a;
      flipped_ = true;
    }
    return status;
  }
  bool Done() override { return inner_->Done(); }
  uint64_t bytes() override { return inner_->bytes(); }

 private:
  std::unique_ptr<Completion> inner_;
  uint8_t* const target_;
  absl::Mutex mu_;
  bool flipped_ ABSL_GUARDED_BY(mu_) = false;
};

// Owns a corrupted scratch copy until the transfer that reads it is finished.
class ScratchCompletion : public Completion {
 public:
  ScratchCompletion(Transport* transport, std::unique_ptr<std::vector<uint8_t>> scratch, MemoryHandle handle,
                    std::unique_ptr<Completion> inner)
      : transport_(transport), scratch_(std::move(scratch)), handle_(handle), inner_(std::move(inner)) {}
  ~ScratchCompletion() override {
    // The scratch bytes must outlive the transfer.
    (void)inner_->Wait(absl::Seconds(30));
    (void)transport_->DeregisterMemory(handle_);
  }
  absl::Status Wait(absl::Duration timeout) override { return inner_->Wait(timeout); }
  bool Done() override { return inner_->Done(); }
  uint64_t bytes() override { return inner_->bytes(); }

 private:
  Transport* const transport_;
  std::unique_ptr<std::vector<uint8_t>> scratch_;
  const MemoryHandle handle_;
  std::unique_ptr<Completion> inner_;
};

// Never completes: a dropped transfer.
class BlackHole : public Completion {
 public:
  absl::Status Wait(absl::Duration timeout) override {
    absl::SleepFor(timeout);
    return absl::DeadlineExceededError("transfer dropped by fault injection");
  }
  bool Done() override { return false; }
  uint64_t bytes() override { return 0; }
};

}  // namespace

FaultTransport::FaultTransport(std::unique_ptr<Transport> inner, FaultPlan plan)
    : ForwardingTransport(std::move(inner)), plan_(plan), gen_(std::seed_seq{plan.seed}) {}

void FaultTransport::SetPlan(const FaultPlan& plan) {
  absl::MutexLock lock(&mu_);
  plan_ = plan;
  gen_ = absl::BitGen(std::seed_seq{plan.seed});
}

FaultCounters FaultTransport::counters() {
  absl::MutexLock lock(&mu_);
  return counters_;
}

Capabilities FaultTransport::GetCapabilities() const {
  Capabilities caps = inner_->GetCapabilities();
  caps.backend = absl::StrCat("fault(", caps.backend, ")");
  caps.maps_peer_memory = false;  // stores through a mapping cannot be faulted: none
  return caps;
}

FaultTransport::Decision FaultTransport::Decide(uint64_t length) {
  absl::MutexLock lock(&mu_);
  Decision d;
  const uint64_t n = counters_.transfers++;
  d.delay = plan_.delay;
  if (plan_.bytes_per_second > 0) d.delay += absl::Seconds(static_cast<double>(length) / plan_.bytes_per_second);
  if (d.delay > absl::ZeroDuration()) ++counters_.delayed;
  if (plan_.fail_after >= 0 && n >= static_cast<uint64_t>(plan_.fail_after)) {
    ++counters_.failed;
    d.fate = Fate::kFail;
  } else if (plan_.drop_probability > 0 && absl::Bernoulli(gen_, plan_.drop_probability)) {
    ++counters_.dropped;
    d.fate = Fate::kDrop;
  } else if (plan_.corrupt_probability > 0 && length > 0 && absl::Bernoulli(gen_, plan_.corrupt_probability)) {
    ++counters_.corrupted;
    d.fate = Fate::kCorrupt;
    d.corrupt_at = absl::Uniform<uint64_t>(gen_, 0, length);
  }
  return d;
}

std::unique_ptr<Completion> FaultTransport::Intercept(const Decision& d) {
  if (d.fate == Fate::kFail) {
    return CompletedWith(absl::UnavailableError("transfer failed by fault injection (fail_after)"));
  }
  if (d.fate == Fate::kDrop) return std::make_unique<BlackHole>();
  return nullptr;
}

std::unique_ptr<Completion> FaultTransport::Delayed(std::unique_ptr<Completion> inner, absl::Duration delay) {
  if (delay <= absl::ZeroDuration()) return inner;
  return std::make_unique<DelayedCompletion>(std::move(inner), absl::Now() + delay);
}

std::unique_ptr<Completion> FaultTransport::CorruptOutbound(
    const MemoryHandle& local, uint64_t offset, uint64_t length, uint64_t corrupt_at,
    const std::function<std::unique_ptr<Completion>(const MemoryHandle&)>& submit) {
  if (local.kind != MemoryKind::kHost || offset > local.length || length > local.length - offset) {
    return submit(local);  // let the inner transport report the bad range
  }
  auto scratch = std::make_unique<std::vector<uint8_t>>(length);
  std::memcpy(scratch->data(), static_cast<const uint8_t*>(local.base) + offset, length);
  (*scratch)[corrupt_at] ^= 0x5a;
  auto handle = inner_->RegisterMemory(scratch->data(), length, MemoryKind::kHost, 0);
  if (!handle.ok()) return CompletedWith(handle.status());
  auto inner = submit(*handle);
  return std::make_unique<ScratchCompletion>(inner_.get(), std::move(scratch), *handle, std::move(inner));
}

std::unique_ptr<Completion> FaultTransport::Put(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                                const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                                uint64_t length) {
  const Decision d = Decide(length);
  if (auto c = Intercept(d)) return c;
  if (d.fate == Fate::kCorrupt) {
    return Delayed(CorruptOutbound(local, local_offset, length, d.corrupt_at,
                                   [&](const MemoryHandle& h) {
                                     const uint64_t off = h.id == local.id ? local_offset : 0;
                                     return inner_->Put(peer, h, off, remote, remote_offset, length);
                                   }),
                   d.delay);
  }
  return Delayed(inner_->Put(peer, local, local_offset, remote, remote_offset, length), d.delay);
}

std::unique_ptr<Completion> FaultTransport::Get(PeerId peer, const MemoryHandle& local, uint64_t local_offset,
                                                const v1::RemoteMemoryDescriptor& remote, uint64_t remote_offset,
                                                uint64_t length) {
  const Decision d = Decide(length);
  if (auto c = Intercept(d)) return c;
  auto inner = inner_->Get(peer, local, local_offset, remote, remote_offset, length);
  if (d.fate == Fate::kCorrupt && local.kind == MemoryKind::kHost && local_offset < local.length &&
      d.corrupt_at < local.length - local_offset) {
    inner = std::make_unique<CorruptingCompletion>(std::move(inner),
                                                   static_cast<uint8_t*>(local.base) + local_offset + d.corrupt_at);
  }
  return Delayed(std::move(inner), d.delay);
}

std::unique_ptr<Completion> FaultTransport::Send(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                                 uint64_t length) {
  const Decision d = Decide(length);
  if (auto c = Intercept(d)) return c;
  if (d.fate == Fate::kCorrupt) {
    return Delayed(CorruptOutbound(local, offset, length, d.corrupt_at,
                                   [&](const MemoryHandle& h) {
                                     const uint64_t off = h.id == local.id ? offset : 0;
                                     return inner_->Send(peer, tag, h, off, length);
                                   }),
                   d.delay);
  }
  return Delayed(inner_->Send(peer, tag, local, offset, length), d.delay);
}

std::unique_ptr<Completion> FaultTransport::Recv(PeerId peer, uint64_t tag, const MemoryHandle& local, uint64_t offset,
                                                 uint64_t capacity) {
  const Decision d = Decide(capacity);
  if (auto c = Intercept(d)) return c;
  auto inner = inner_->Recv(peer, tag, local, offset, capacity);
  if (d.fate == Fate::kCorrupt && local.kind == MemoryKind::kHost && offset < local.length &&
      d.corrupt_at < local.length - offset) {
    // Flip within the first byte range that certainly arrived: byte 0 if the message
    // may be shorter than capacity.
    inner = std::make_unique<CorruptingCompletion>(std::move(inner), static_cast<uint8_t*>(local.base) + offset);
  }
  return Delayed(std::move(inner), d.delay);
}

}  // namespace rlfleet::transport

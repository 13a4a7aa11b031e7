#include "libs/transport/transport.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace rlfleet::transport {

absl::Status PendingCompletion::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("transfer not finished after ", absl::FormatDuration(timeout)));
  }
  return status_;
}

bool PendingCompletion::Done() {
  absl::MutexLock lock(&mu_);
  return done_;
}

uint64_t PendingCompletion::bytes() {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

void PendingCompletion::Finish(absl::Status status, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  done_ = true;
  status_ = std::move(status);
  bytes_ = bytes;
}

std::unique_ptr<Completion> CompletedWith(absl::Status status, uint64_t bytes) {
  auto completion = std::make_unique<PendingCompletion>();
  completion->Finish(std::move(status), bytes);
  return completion;
}

std::unique_ptr<Completion> Share(std::shared_ptr<PendingCompletion> pending) {
  class Shared : public Completion {
   public:
    explicit Shared(std::shared_ptr<PendingCompletion> c) : c_(std::move(c)) {}
    absl::Status Wait(absl::Duration timeout) override { return c_->Wait(timeout); }
    bool Done() override { return c_->Done(); }
    uint64_t bytes() override { return c_->bytes(); }

   private:
    std::shared_ptr<PendingCompletion> c_;
  };
  return std::make_unique<Shared>(std::move(pending));
}

namespace {

// Completes when every part completed; reports the first error.
class All : public Completion {
 public:
  explicit All(std::vector<std::unique_ptr<Completion>> parts) : parts_(std::move(parts)) {}
  absl::Status Wait(absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    absl::Status first;
    for (auto& part : parts_) {
      absl::Status s = part->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
      if (absl::IsDeadlineExceeded(s)) return s;
      first.Update(s);
    }
    return first;
  }
  bool Done() override {
    for (auto& part : parts_) {
      if (!part->Done()) return false;
    }
    return true;
  }
  uint64_t bytes() override {
    uint64_t n = 0;
    for (auto& part : parts_) n += part->bytes();
    return n;
  }
  void Cancel() override {
    for (auto& part : parts_) part->Cancel();
  }

 private:
  std::vector<std::unique_ptr<Completion>> parts_;
};

}  // namespace

std::unique_ptr<Completion> AllOf(std::vector<std::unique_ptr<Completion>> parts) {
  return std::make_unique<All>(std::move(parts));
}

std::unique_ptr<Completion> Transport::PutBatch(PeerId peer, const std::vector<PutOp>& ops) {
  if (ops.empty()) return CompletedWith(absl::InvalidArgumentError("PutBatch: no puts"));
  std::vector<std::unique_ptr<Completion>> parts;
  for (const PutOp& op : ops) {
    if (op.remote == nullptr) {
      parts.push_back(CompletedWith(absl::InvalidArgumentError("PutBatch: op without remote")));
      continue;
    }
    parts.push_back(Put(peer, op.local, op.local_offset, *op.remote, op.remote_offset, op.length));
  }
  return AllOf(std::move(parts));
}

absl::StatusOr<std::unique_ptr<RemoteMapping>> Transport::MapRemote(PeerId, const v1::RemoteMemoryDescriptor&) {
  return absl::UnimplementedError(
      absl::StrCat("the ", GetCapabilities().backend, " backend cannot map a peer's memory"));
}

std::unique_ptr<Completion> Transport::SendRecvBatch(const std::vector<TwoSidedOp>& ops) {
  if (ops.empty()) return CompletedWith(absl::InvalidArgumentError("SendRecvBatch: no operations"));
  std::vector<std::unique_ptr<Completion>> parts;
  parts.reserve(ops.size());
  for (const TwoSidedOp& op : ops) {
    parts.push_back(op.send ? Send(op.peer, op.tag, op.memory, op.offset, op.length)
                            : Recv(op.peer, op.tag, op.memory, op.offset, op.length));
  }
  return AllOf(std::move(parts));
}

absl::Status CheckRange(absl::string_view what, uint64_t offset, uint64_t length, uint64_t region_length) {
  if (length == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": zero-length transfer"));
  if (offset > region_length || length > region_length - offset) {
    return absl::OutOfRangeError(absl::StrCat(what, ": bytes [", offset, ", ", offset + length, ") are outside the ",
                                              region_length, "-byte registration"));
  }
  return absl::OkStatus();
}

std::string BaseBackend(const Capabilities& capabilities) {
  absl::string_view name = capabilities.backend;
  size_t open = name.find('(');
  while (open != absl::string_view::npos && !name.empty() && name.back() == ')') {
    name = name.substr(open + 1, name.size() - open - 2);
    open = name.find('(');
  }
  return std::string(name);
}

}  // namespace rlfleet::transport

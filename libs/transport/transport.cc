#include "libs/transport/transport.h"

#include "absl/strings/str_cat.h"

namespace rlfleet::transport {

absl::Status PendingCompletion::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("transfer not finished after ", absl::FormatDuration(timeout)));
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

absl::Status CheckRange(absl::string_view what, uint64_t offset, uint64_t length,
                        uint64_t region_length) {
  if (length == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": zero-length transfer"));
  if (offset > region_length || length > region_length - offset) {
    return absl::OutOfRangeError(absl::StrCat(what, ": bytes [", offset, ", ", offset + length,
                                              ") are outside the ", region_length,
                                              "-byte registration"));
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::transport

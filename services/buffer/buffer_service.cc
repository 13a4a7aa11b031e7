#include "services/buffer/buffer_service.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/rpc/status_conversion.h"

namespace rlfleet::buffer {
namespace {

// Adds one message's reply into the stream's total.
void Sum(const v1::PutExperiencesResponse& one, v1::PutExperiencesResponse* total) {
  total->set_accepted(total->accepted() + one.accepted());
  total->set_duplicates(total->duplicates() + one.duplicates());
  total->set_rejected(total->rejected() + one.rejected());
  for (const auto& id : one.duplicate_ids()) *total->add_duplicate_ids() = id;
  for (const auto& r : one.rejections()) *total->add_rejections() = r;
  total->set_buffer_bytes(one.buffer_bytes());
  total->set_capacity_bytes(one.capacity_bytes());
}

// One stream. A detached worker reads messages (StartRead, then OnReadDone) and
// applies them, reading message i+1 while it applies message i (so the producer's
// sending overlaps the buffer's durable write); it calls Finish last, with no read
// outstanding, and touches nothing after; OnDone deletes the reactor.
class IngestReactor : public grpc::ServerReadReactor<v1::PutExperiencesRequest> {
 public:
  IngestReactor(BufferCore* core, v1::PutExperiencesResponse* response, absl::Duration full_wait)
      : core_(core), response_(response), full_wait_(full_wait) {
    std::thread([this] { Run(); }).detach();
  }
  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    reading_ = false;
    read_ok_ = ok;
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  void OnDone() override { delete this; }

 private:
  void StartReading(v1::PutExperiencesRequest* into) {
    absl::MutexLock lock(&mu_);
    reading_ = true;
    StartRead(into);
  }
  // Waits for the outstanding read: whether it got a message, and whether the call
  // was cancelled.
  std::pair<bool, bool> AwaitRead() {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !reading_; };
    mu_.Await(absl::Condition(&done));
    return {read_ok_, cancelled_};
  }

  void Run() {
    int current = 0;
    StartReading(&requests_[current]);
    for (int index = 0;; ++index) {
      auto [ok, cancelled] = AwaitRead();
      if (cancelled) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled"));
      if (!ok) return Finish(grpc::Status::OK);  // the producer closed its side
      StartReading(&requests_[1 - current]);     // the next message, while this one is applied
      absl::Status s = Apply(requests_[current], index);
      if (!s.ok()) {
        AwaitRead();  // (Finish with no read outstanding)
        return Finish(rpc::ToGrpcStatus(s));
      }
      current = 1 - current;
    }
  }

  // Applies message `index`, retrying while the buffer is full (flow control: at most
  // one more message is read meanwhile).
  absl::Status Apply(const v1::PutExperiencesRequest& request, int index) {
    const absl::Time give_up = absl::Now() + full_wait_;
    for (;;) {
      v1::PutExperiencesResponse one;
      absl::Status s = core_->Put(request, &one);
      if (s.ok()) {
        Sum(one, response_);
        return s;
      }
      if (!absl::IsResourceExhausted(s) || absl::Now() >= give_up) {
        return absl::Status(s.code(), absl::StrCat("message ", index, " of the stream: ", s.message()));
      }
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&cancelled_), absl::Milliseconds(100))) {
          return absl::CancelledError("stream cancelled");
        }
      }
    }
  }

  BufferCore* const core_;
  v1::PutExperiencesResponse* const response_;
  const absl::Duration full_wait_;
  v1::PutExperiencesRequest requests_[2];
  absl::Mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool read_ok_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerReadReactor<v1::PutExperiencesRequest>* BufferServiceImpl::StreamExperiences(
    grpc::CallbackServerContext* c, v1::PutExperiencesResponse* resp) {
  if (absl::Status s = rpc::CheckBearerToken(*c, auth_.token); !s.ok()) {
    return new rpc::FinishedStream<grpc::ServerReadReactor<v1::PutExperiencesRequest>>(rpc::ToGrpcStatus(s));
  }
  return new IngestReactor(core_, resp, full_wait_);
}

}  // namespace rlfleet::buffer

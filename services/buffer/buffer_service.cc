#include "services/buffer/buffer_service.h"

#include <grpcpp/impl/codegen/proto_utils.h>

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
class IngestReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  IngestReactor(BufferCore* core, grpc::ByteBuffer* response, absl::Duration full_wait)
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
  void StartReading(grpc::ByteBuffer* into) {
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
    StartReading(&messages_[current]);
    for (int index = 0;; ++index) {
      auto [ok, cancelled] = AwaitRead();
      if (cancelled) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled"));
      if (!ok) {  // the producer closed its side
        bool own = false;
        grpc::Status s = grpc::SerializationTraits<v1::PutExperiencesResponse>::Serialize(total_, response_, &own);
        return Finish(s);
      }
      grpc::Status parsed =
          grpc::SerializationTraits<v1::PutExperiencesRequestWire>::Deserialize(&messages_[current], &request_);
      StartReading(&messages_[1 - current]);  // the next message, while this one is applied
      absl::Status s =
          parsed.ok()
              ? Apply(&request_, index)
              : absl::InvalidArgumentError(absl::StrCat(
                    "message ", index, " of the stream is not a PutExperiencesRequest: ", parsed.error_message()));
      if (!s.ok()) {
        AwaitRead();  // (Finish with no read outstanding)
        return Finish(rpc::ToGrpcStatus(s));
      }
      current = 1 - current;
    }
  }

  // Applies message `index` (its accepted experiences move into the buffer), retrying
  // while the buffer is full (flow control: at most one more message is read meanwhile).
  absl::Status Apply(v1::PutExperiencesRequestWire* request, int index) {
    const absl::Time give_up = absl::Now() + full_wait_;
    for (;;) {
      v1::PutExperiencesResponse one;
      absl::Status s = core_->Put(request, &one);
      if (s.ok()) {
        Sum(one, &total_);
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
  grpc::ByteBuffer* const response_;
  const absl::Duration full_wait_;
  v1::PutExperiencesResponse total_;
  grpc::ByteBuffer messages_[2];
  v1::PutExperiencesRequestWire request_;  // the message being applied (reused)
  absl::Mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool read_ok_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* BufferServiceImpl::StreamExperiences(grpc::CallbackServerContext* c,
                                                                                grpc::ByteBuffer* resp) {
  if (absl::Status s = rpc::Authorize(*c, auth_, rpc::Role::kFleet, "StreamExperiences"); !s.ok()) {
    return new rpc::FinishedStream<grpc::ServerReadReactor<grpc::ByteBuffer>>(rpc::ToGrpcStatus(s));
  }
  return new IngestReactor(core_, resp, full_wait_);
}

}  // namespace rlfleet::buffer

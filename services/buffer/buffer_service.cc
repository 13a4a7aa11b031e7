#include "services/buffer/buffer_service.h"

#include <grpcpp/alarm.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/common/status_macros.h"
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

// `bytes` (consumed) read as `*message`, the form (or the wire form) of the request
// `type` names; INVALID_ARGUMENT naming `what` when they are not one.
template <typename Message>
absl::Status ParseRaw(grpc::ByteBuffer* bytes, Message* message, absl::string_view what, absl::string_view type) {
  const grpc::Status parsed = grpc::SerializationTraits<Message>::Deserialize(bytes, message);
  if (parsed.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " is not a ", type, ": ",
                   parsed.error_message().empty() ? "its bytes do not parse" : parsed.error_message()));
}

absl::Status ParseWire(grpc::ByteBuffer* bytes, v1::PutExperiencesRequestWire* request, absl::string_view what) {
  return ParseRaw(bytes, request, what, "PutExperiencesRequest");
}

// `reply` serialized into the raw call's response.
template <typename Message>
absl::Status SerializeReply(const Message& reply, grpc::ByteBuffer* out) {
  bool own = false;
  return rpc::ToAbslStatus(grpc::SerializationTraits<Message>::Serialize(reply, out, &own));
}

// Sets a new gRPC callback alarm in `*alarm` to call `f` after `after`. A new one each
// time: Set on an alarm whose callback is still running (the chain that re-sets it may
// run inside it) would replace the callback in use; the old alarm's destruction
// cancels nothing that has fired, and its running callback holds its own reference.
void SetAlarm(std::unique_ptr<grpc::Alarm>* alarm, absl::Duration after, std::function<void(bool)> f) {
  *alarm = std::make_unique<grpc::Alarm>();
  (*alarm)->Set(absl::ToChronoTime(absl::Now() + after), std::move(f));
}

// One stream, driven by its callbacks (no thread of its own, none waiting for the
// store). Messages are applied in order, one Put at a time; consecutive ones are merged
// into one Put (same producer and run, up to kMaxExperiencesPerPut experiences), so a
// producer streaming small messages pays one store commit per batch, not per message:
// a batch that could still grow waits up to `linger` (a gRPC alarm) for more unless
// the stream's reads have ended or it holds kApplyBytes, and what is read while a Put
// is in flight goes in the next Put. Reading pauses while kMaxPendingBytes are
// waiting (flow control: a full buffer holds the producer back). A merged Put that
// fails is applied again one message at a time, so what is accepted and the error
// (naming the message) are as if each message were put alone. While the buffer is full
// a message is retried every 100 ms (a gRPC alarm) for up to `full_wait`. Finish is
// called once, with no Put or retry alarm outstanding (a set linger alarm is cancelled);
// the last of OnDone and the linger alarm's callback deletes the reactor.
// StartRead, Finish, PutAsync and the alarm are never started holding mu_ (a Put may
// answer inline).
class IngestReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  static constexpr uint64_t kMaxPendingBytes = 4 << 20;

  // A batch that can still grow is applied when it is this big (or when the stream's
  // reads end, or when it has waited `linger`).
  static constexpr uint64_t kApplyBytes = 1 << 20;

  IngestReactor(BufferCore* core, grpc::ByteBuffer* response, absl::Duration full_wait, absl::Duration linger,
                std::atomic<uint64_t>* messages_read)
      : core_(core), response_(response), full_wait_(full_wait), linger_(linger), messages_read_(messages_read) {
    {
      absl::MutexLock lock(&mu_);
      reading_ = true;
    }
    StartRead(&message_);
  }
  void OnReadDone(bool ok) override {
    Next next;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (!ok) {  // the producer closed its side (or the call is gone: then Finish goes nowhere)
        reads_done_ = true;
      } else {
        const uint64_t bytes = message_.Length();
        v1::PutExperiencesRequestWire wire;
        if (absl::Status s = ParseWire(&message_, &wire, absl::StrCat("message ", read_, " of the stream")); !s.ok()) {
          if (error_.ok()) error_ = s;  // (after the messages before it are applied)
        } else {
          QueueLocked(std::move(wire), bytes);
        }
        ++read_;
        ++*messages_read_;
      }
      next = NextLocked();
    }
    Run(next);
  }
  void OnCancel() override { cancelled_ = true; }
  // The last of OnDone and a set linger alarm's callback deletes the reactor.
  void OnDone() override {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      last = !lingering_;
    }
    if (last) delete this;
  }

 private:
  // Messages applied by one Put.
  struct Batch {
    v1::PutExperiencesRequestWire request;
    std::vector<int> sizes;  // each message's experiences, in order
    int first = 0;           // its first message's index in the stream
    uint64_t bytes = 0;      // counted in pending_bytes_ while it waits
    bool mergeable = true;   // (not one split off a failed merged Put, nor empty)
  };
  // What to start once mu_ is released.
  struct Next {
    bool read = false;
    bool apply = false;
    bool retry = false;   // the Put in flight again after 100 ms (Applied only)
    bool linger = false;  // set the linger alarm
    bool cancel_linger = false;
    std::optional<grpc::Status> finish;
  };

  void QueueLocked(v1::PutExperiencesRequestWire wire, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int n = wire.experiences_size();
    pending_bytes_ += bytes;
    if (n > 0 && !pending_.empty()) {
      Batch& last = pending_.back();
      if (last.mergeable && last.request.producer_id() == wire.producer_id() &&
          last.request.run_id() == wire.run_id() && last.request.experiences_size() + n <= kMaxExperiencesPerPut) {
        for (std::string& e : *wire.mutable_experiences()) last.request.add_experiences(std::move(e));
        last.sizes.push_back(n);
        last.bytes += bytes;
        return;
      }
    }
    Batch b;
    b.request = std::move(wire);
    b.sizes = {n};
    b.first = read_;
    b.bytes = bytes;
    b.mergeable = n > 0;  // (an empty message gets Put's own error, naming it)
    pending_.push_back(std::move(b));
  }

  // Whether the batch at the front goes now: it cannot grow (another batch follows it,
  // it is full, nothing more will be read) or it is big enough or has lingered.
  bool FrontReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Batch& front = pending_.front();
    return pending_.size() > 1 || reads_done_ || !error_.ok() || !front.mergeable ||
           front.request.experiences_size() >= static_cast<int>(kMaxExperiencesPerPut) || front.bytes >= kApplyBytes ||
           lingered_ || linger_ <= absl::ZeroDuration();
  }

  // The next Put when none is in flight (after the linger when the batch could still
  // grow), the end once nothing is left to apply and no alarm is set, and another read
  // while there is room.
  Next NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Next next;
    if (finished_) return next;
    if (!applying_ && !pending_.empty() && FrontReadyLocked()) {
      inflight_ = std::move(pending_.front());
      pending_.pop_front();
      pending_bytes_ -= inflight_.bytes;
      give_up_ = absl::Now() + full_wait_;
      applying_ = true;
      lingered_ = false;
      next.apply = true;
    } else if (!applying_ && !pending_.empty()) {
      if (!lingering_) {
        lingering_ = true;
        next.linger = true;
      }
    } else if (!applying_ && (reads_done_ || !error_.ok())) {
      finished_ = true;
      next.cancel_linger = lingering_;
      next.finish = rpc::ToGrpcStatus(error_.ok() ? SerializeReply(total_, response_) : error_);
      return next;
    }
    if (!reading_ && !reads_done_ && error_.ok() && pending_bytes_ < kMaxPendingBytes) {
      reading_ = true;
      next.read = true;
    }
    return next;
  }

  void Run(Next& next) {
    if (next.finish) {
      if (next.cancel_linger) linger_alarm_->Cancel();  // (before Finish: OnDone cannot have run)
      return Finish(std::move(*next.finish));
    }
    // (a linger is only set from OnReadDone, before the read that follows it: nothing
    // can finish the stream, and so cancel the alarm, before it is set)
    if (next.linger) SetAlarm(&linger_alarm_, linger_, [this](bool) { Lingered(); });
    if (next.read) StartRead(&message_);
    if (next.apply) Apply();
  }

  // The linger alarm went off (or was cancelled as the stream finished): the batch
  // waiting goes now.
  void Lingered() {
    Next next;
    bool last;
    {
      absl::MutexLock lock(&mu_);
      lingering_ = false;
      lingered_ = !pending_.empty();
      next = NextLocked();
      last = done_;
    }
    if (last) {
      delete this;
      return;
    }
    Run(next);
  }

  void Apply() {
    one_.Clear();
    core_->PutAsync(&inflight_.request, &one_, [this](absl::Status s) { Applied(s); });
  }

  // inflight_ is applied (OK), or failed: a merged Put is split into its messages and
  // they are applied one by one; a full buffer retries a message until give_up_ (nothing
  // of it was taken); any other error ends the stream.
  void Applied(const absl::Status& s) {
    Next next;
    {
      absl::MutexLock lock(&mu_);
      if (s.ok()) {
        Sum(one_, &total_);
        applying_ = false;
        lingered_ = !pending_.empty();  // (what was read meanwhile has waited a Put's time)
      } else if (inflight_.sizes.size() > 1) {
        SplitInflightLocked();
        applying_ = false;
      } else if (absl::IsResourceExhausted(s) && absl::Now() < give_up_ && !cancelled_) {
        next.retry = true;  // (the alarm is the one operation of this chain now)
      } else {
        FailLocked(absl::Status(s.code(), absl::StrCat("message ", inflight_.first, " of the stream: ", s.message())));
      }
      if (!next.retry) next = NextLocked();
    }
    if (next.retry) {
      SetAlarm(&retry_, absl::Milliseconds(100), [this](bool) { Retry(); });
      return;
    }
    Run(next);
  }

  void Retry() {
    if (!cancelled_) return Apply();
    Next next;
    {
      absl::MutexLock lock(&mu_);
      FailLocked(absl::CancelledError("stream cancelled"));
      next = NextLocked();
    }
    Run(next);
  }

  // The Put in flight failed for good: the stream ends with `error` (what follows it
  // is not applied).
  void FailLocked(absl::Status error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    error_ = std::move(error);
    pending_.clear();
    applying_ = false;
  }

  // The failed merged Put (which took nothing and still holds every experience) back at
  // the front of the queue, one batch per message.
  void SplitInflightLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Batch> singles(inflight_.sizes.size());
    int at = 0;
    for (size_t m = 0; m < singles.size(); ++m) {
      Batch& b = singles[m];
      b.request.set_producer_id(inflight_.request.producer_id());
      b.request.set_run_id(inflight_.request.run_id());
      for (int k = 0; k < inflight_.sizes[m]; ++k)
        b.request.add_experiences(std::move(*inflight_.request.mutable_experiences(at++)));
      b.sizes = {inflight_.sizes[m]};
      b.first = inflight_.first + static_cast<int>(m);
      b.mergeable = false;
    }
    for (auto it = singles.rbegin(); it != singles.rend(); ++it) pending_.push_front(std::move(*it));
  }

  BufferCore* const core_;
  grpc::ByteBuffer* const response_;
  const absl::Duration full_wait_;
  const absl::Duration linger_;
  std::atomic<uint64_t>* const messages_read_;  // the service's count
  grpc::ByteBuffer message_;                    // the read in flight's (one at a time)
  // The Put in flight's (one at a time; the chain of Put, alarm and retry owns them).
  Batch inflight_;
  v1::PutExperiencesResponse one_;
  absl::Time give_up_;
  std::unique_ptr<grpc::Alarm> retry_;
  std::unique_ptr<grpc::Alarm> linger_alarm_;
  std::atomic<bool> cancelled_{false};

  absl::Mutex mu_;
  std::deque<Batch> pending_ ABSL_GUARDED_BY(mu_);  // read, waiting for the Put in flight
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int read_ ABSL_GUARDED_BY(mu_) = 0;  // messages read
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool applying_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;       // OnDone has run
  bool lingering_ ABSL_GUARDED_BY(mu_) = false;  // the linger alarm is set
  bool lingered_ ABSL_GUARDED_BY(mu_) = false;   // the front batch has waited enough
  absl::Status error_ ABSL_GUARDED_BY(mu_);      // what the stream ends with, once nothing is applying
  v1::PutExperiencesResponse total_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerUnaryReactor* BufferServiceImpl::PutExperiences(grpc::CallbackServerContext* c, const grpc::ByteBuffer* req,
                                                            grpc::ByteBuffer* resp) {
  return rpc::HandleUnaryAsync(c, auth_, rpc::Role::kFleet, "PutExperiences", [&](auto finish) {
    struct Call {
      v1::PutExperiencesRequestWire request;
      v1::PutExperiencesResponse response;
    };
    auto call = std::make_shared<Call>();
    grpc::ByteBuffer copy(*req);  // (Deserialize consumes its buffer; this shares the slices)
    if (absl::Status s = ParseWire(&copy, &call->request, "request"); !s.ok()) return finish(s);
    core_->PutAsync(&call->request, &call->response, [resp, call, finish = std::move(finish)](absl::Status status) {
      if (status.ok()) status = SerializeReply(call->response, resp);
      finish(status);
    });
  });
}

grpc::ServerUnaryReactor* BufferServiceImpl::SampleBatch(grpc::CallbackServerContext* c, const grpc::ByteBuffer* req,
                                                         grpc::ByteBuffer* resp) {
  return rpc::HandleUnary(c, auth_, rpc::Role::kFleet, "SampleBatch", [&]() -> absl::Status {
    v1::SampleBatchRequest request;
    grpc::ByteBuffer copy(*req);  // (Deserialize consumes its buffer; this shares the slices)
    RETURN_IF_ERROR(ParseRaw(&copy, &request, "request", "SampleBatchRequest"));
    v1::SampleBatchResponseWire reply;
    RETURN_IF_ERROR(core_->SampleBatch(request, &reply));
    return SerializeReply(reply, resp);
  });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* BufferServiceImpl::StreamExperiences(grpc::CallbackServerContext* c,
                                                                                grpc::ByteBuffer* resp) {
  if (absl::Status s = rpc::Authorize(*c, auth_, rpc::Role::kFleet, "StreamExperiences"); !s.ok()) {
    return new rpc::FinishedStream<grpc::ServerReadReactor<grpc::ByteBuffer>>(rpc::ToGrpcStatus(s));
  }
  return new IngestReactor(core_, resp, full_wait_, linger_, &stream_messages_read_);
}

}  // namespace rlfleet::buffer

#include "services/buffer/buffer_service.h"

#include <grpcpp/alarm.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <atomic>
#include <chrono>

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

// `bytes` (consumed) read as the wire form of a PutExperiencesRequest; INVALID_ARGUMENT
// naming `what` when they are not one.
absl::Status ParseWire(grpc::ByteBuffer* bytes, v1::PutExperiencesRequestWire* request, absl::string_view what) {
  const grpc::Status parsed = grpc::SerializationTraits<v1::PutExperiencesRequestWire>::Deserialize(bytes, request);
  if (parsed.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " is not a PutExperiencesRequest: ",
                   parsed.error_message().empty() ? "its bytes do not parse" : parsed.error_message()));
}

// `reply` serialized into the raw call's response.
absl::Status SerializeReply(const v1::PutExperiencesResponse& reply, grpc::ByteBuffer* out) {
  bool own = false;
  return rpc::ToAbslStatus(grpc::SerializationTraits<v1::PutExperiencesResponse>::Serialize(reply, out, &own));
}

// One stream, driven by its callbacks (no thread of its own, none waiting for the
// store): read a message, apply it (PutAsync), and only then read the next, so a full
// buffer holds the producer back (flow control). While the buffer is full the message
// is retried every 100 ms (a gRPC alarm) for up to `full_wait`. Finish is called from
// that chain only, with no read, Put or alarm outstanding; OnDone deletes the reactor.
class IngestReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  IngestReactor(BufferCore* core, grpc::ByteBuffer* response, absl::Duration full_wait)
      : core_(core), response_(response), full_wait_(full_wait) {
    StartRead(&message_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {  // the producer closed its side (or the call is gone: then Finish goes nowhere)
      return Finish(rpc::ToGrpcStatus(SerializeReply(total_, response_)));
    }
    request_.Clear();
    if (absl::Status s = ParseWire(&message_, &request_, absl::StrCat("message ", index_, " of the stream")); !s.ok()) {
      return Finish(rpc::ToGrpcStatus(s));
    }
    give_up_ = absl::Now() + full_wait_;
    Apply();
  }
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override { delete this; }

 private:
  void Apply() {
    one_.Clear();
    core_->PutAsync(&request_, &one_, [this](absl::Status s) { Applied(s); });
  }
  // Message index_ is applied (OK), or failed: the buffer full (retried until give_up_;
  // nothing of it was taken) or any other error (ends the stream).
  void Applied(const absl::Status& s) {
    if (s.ok()) {
      Sum(one_, &total_);
      ++index_;
      StartRead(&message_);
      return;
    }
    if (absl::IsResourceExhausted(s) && absl::Now() < give_up_ && !cancelled_) {
      retry_.Set(std::chrono::system_clock::now() + std::chrono::milliseconds(100), [this](bool) {
        if (cancelled_) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled"));
        Apply();
      });
      return;
    }
    Finish(
        rpc::ToGrpcStatus(absl::Status(s.code(), absl::StrCat("message ", index_, " of the stream: ", s.message()))));
  }

  BufferCore* const core_;
  grpc::ByteBuffer* const response_;
  const absl::Duration full_wait_;
  // One operation at a time touches these (read, Put, alarm: each starts the next).
  grpc::ByteBuffer message_;
  v1::PutExperiencesRequestWire request_;  // the message being applied
  v1::PutExperiencesResponse one_;         // its reply
  v1::PutExperiencesResponse total_;
  int index_ = 0;
  absl::Time give_up_;
  grpc::Alarm retry_;
  std::atomic<bool> cancelled_{false};
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

grpc::ServerReadReactor<grpc::ByteBuffer>* BufferServiceImpl::StreamExperiences(grpc::CallbackServerContext* c,
                                                                                grpc::ByteBuffer* resp) {
  if (absl::Status s = rpc::Authorize(*c, auth_, rpc::Role::kFleet, "StreamExperiences"); !s.ok()) {
    return new rpc::FinishedStream<grpc::ServerReadReactor<grpc::ByteBuffer>>(rpc::ToGrpcStatus(s));
  }
  return new IngestReactor(core_, resp, full_wait_);
}

}  // namespace rlfleet::buffer

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
      bool own = false;
      return Finish(grpc::SerializationTraits<v1::PutExperiencesResponse>::Serialize(total_, response_, &own));
    }
    request_.Clear();
    grpc::Status parsed = grpc::SerializationTraits<v1::PutExperiencesRequestWire>::Deserialize(&message_, &request_);
    if (!parsed.ok()) {
      return Finish(rpc::ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("message ", index_, " of the stream is not a PutExperiencesRequest: ",
                       parsed.error_message().empty() ? "its bytes do not parse" : parsed.error_message()))));
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
  grpc::ServerUnaryReactor* reactor = c->DefaultReactor();
  if (absl::Status s = rpc::Authorize(*c, auth_, rpc::Role::kFleet, "PutExperiences"); !s.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(s));
    return reactor;
  }
  struct Call {
    v1::PutExperiencesRequestWire request;
    v1::PutExperiencesResponse response;
  };
  auto call = std::make_shared<Call>();
  grpc::ByteBuffer copy(*req);  // (Deserialize consumes its buffer; this shares the slices)
  if (grpc::Status parsed =
          grpc::SerializationTraits<v1::PutExperiencesRequestWire>::Deserialize(&copy, &call->request);
      !parsed.ok()) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        "request is not a PutExperiencesRequest: " +
            (parsed.error_message().empty() ? std::string("its bytes do not parse") : parsed.error_message())));
    return reactor;
  }
  core_->PutAsync(&call->request, &call->response, [reactor, resp, call](absl::Status status) {
    if (status.ok()) {
      bool own = false;
      grpc::Status s = grpc::SerializationTraits<v1::PutExperiencesResponse>::Serialize(call->response, resp, &own);
      reactor->Finish(s);
      return;
    }
    reactor->Finish(rpc::ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* BufferServiceImpl::StreamExperiences(grpc::CallbackServerContext* c,
                                                                                grpc::ByteBuffer* resp) {
  if (absl::Status s = rpc::Authorize(*c, auth_, rpc::Role::kFleet, "StreamExperiences"); !s.ok()) {
    return new rpc::FinishedStream<grpc::ServerReadReactor<grpc::ByteBuffer>>(rpc::ToGrpcStatus(s));
  }
  return new IngestReactor(core_, resp, full_wait_);
}

}  // namespace rlfleet::buffer

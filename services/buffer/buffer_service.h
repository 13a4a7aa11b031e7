// gRPC adapter for BufferCore (BufferService). Thread-safe.
//
// PutExperiences, StreamExperiences and SampleBatch are served raw: each Put message is
// read as a PutExperiencesRequestWire (the same bytes), so the buffer keeps every
// experience's bytes as they were sent and SampleBatch sends those bytes back unparsed;
// a Put is answered when the store has it, with no gRPC thread waiting for Redis
// meanwhile.
//
// StreamExperiences applies the messages in order, one Put at a time, consecutive ones
// merged (one store commit for many small messages): a message waits up to `linger`
// for the next ones unless the stream's reads have ended, and those read while a Put
// is in flight go in the next. What is accepted and the errors are as if each message
// were put alone (a merged Put that fails is applied again message by message). While
// the buffer is full (RESOURCE_EXHAUSTED) a message is retried for up to `full_wait`
// and reading stops once 4 MiB wait (flow control), then the stream ends with
// RESOURCE_EXHAUSTED naming the message; any other error ends it at once. The reply
// sums every message.
#ifndef RLFLEET_SERVICES_BUFFER_BUFFER_SERVICE_H_
#define RLFLEET_SERVICES_BUFFER_BUFFER_SERVICE_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "libs/rpc/server_call.h"
#include "rlfleet/v1/buffer.grpc.pb.h"
#include "services/buffer/buffer_core.h"

namespace rlfleet::buffer {

class BufferServiceImpl final
    : public v1::BufferService::WithRawCallbackMethod_SampleBatch<
          v1::BufferService::WithRawCallbackMethod_StreamExperiences<
              v1::BufferService::WithRawCallbackMethod_PutExperiences<v1::BufferService::CallbackService>>> {
 public:
  // `linger`: how long a stream's message may wait to be merged with the next ones (0:
  // none), the most an experience's sampling is delayed by.
  BufferServiceImpl(BufferCore* core, rpc::CallAuth auth, absl::Duration full_wait = absl::Seconds(30),
                    absl::Duration linger = absl::Milliseconds(2))
      : core_(core), auth_(std::move(auth)), full_wait_(full_wait), linger_(linger) {}

  grpc::ServerReadReactor<grpc::ByteBuffer>* StreamExperiences(grpc::CallbackServerContext* c,
                                                               grpc::ByteBuffer* resp) override;
  // Messages the streams have read so far (applied or waiting to be).
  uint64_t stream_messages_read() const { return stream_messages_read_.load(); }

  // Served raw too (read as a PutExperiencesRequestWire, as the stream is), and answered
  // when the store has the experiences, without holding a gRPC thread meanwhile.
  grpc::ServerUnaryReactor* PutExperiences(grpc::CallbackServerContext* c, const grpc::ByteBuffer* req,
                                           grpc::ByteBuffer* resp) override;
  // Answered raw: the experiences' stored bytes spliced into the reply's wire form (a
  // SampleBatchResponse to the caller), none parsed. May wait up to wait_ms for groups;
  // the caller's deadline should exceed it.
  grpc::ServerUnaryReactor* SampleBatch(grpc::CallbackServerContext* c, const grpc::ByteBuffer* req,
                                        grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* AckBatch(grpc::CallbackServerContext* c, const v1::AckBatchRequest* req,
                                     v1::AckBatchResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->Ack(*req, resp); });
  }
  grpc::ServerUnaryReactor* NackBatch(grpc::CallbackServerContext* c, const v1::NackBatchRequest* req,
                                      v1::NackBatchResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->Nack(*req, resp); });
  }
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* c, const v1::GetStatsRequest*,
                                     v1::GetStatsResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->GetStats(resp); });
  }
  grpc::ServerUnaryReactor* Configure(grpc::CallbackServerContext* c, const v1::ConfigureRequest* req,
                                      v1::ConfigureResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->Configure(*req, resp); });
  }

 private:
  BufferCore* const core_;
  const rpc::CallAuth auth_;
  const absl::Duration full_wait_;
  const absl::Duration linger_;
  std::atomic<uint64_t> stream_messages_read_{0};
};

}  // namespace rlfleet::buffer

#endif  // RLFLEET_SERVICES_BUFFER_BUFFER_SERVICE_H_

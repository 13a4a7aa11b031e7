// BufferSource over the buffer's gRPC API (BufferService), with the client base's
// deadlines and retries. Thread-safe.
#ifndef RLFLEET_SERVICES_TRAINER_BUFFER_CLIENT_H_
#define RLFLEET_SERVICES_TRAINER_BUFFER_CLIENT_H_

#include <memory>

#include "libs/rpc/client.h"
#include "rlfleet/v1/buffer.grpc.pb.h"
#include "services/trainer/trainer_core.h"

namespace rlfleet::trainer {

class GrpcBufferSource : public BufferSource, public rpc::ClientBase {
 public:
  GrpcBufferSource(std::shared_ptr<grpc::Channel> channel, rpc::ClientOptions options)
      : ClientBase(channel, std::move(options)), stub_(v1::BufferService::NewStub(channel)) {}

  absl::Status Sample(const v1::SampleBatchRequest& request, v1::SampleBatchResponse* response) override {
    // The buffer may wait up to wait_ms: the deadline covers it.
    const absl::Duration timeout = options().default_timeout + absl::Milliseconds(request.wait_ms());
    // (a batch leased by an attempt whose answer was lost goes back when its lease ends)
    return Call(
        "SampleBatch", [&](grpc::ClientContext* c) { return stub_->SampleBatch(c, request, response); },
        rpc::Retry::kIdempotent, timeout);
  }
  absl::Status Ack(const std::string& lease_id) override {
    v1::AckBatchRequest request;
    request.set_lease_id(lease_id);
    v1::AckBatchResponse response;
    return Call(
        "AckBatch", [&](grpc::ClientContext* c) { return stub_->AckBatch(c, request, &response); },
        rpc::Retry::kIdempotent);
  }
  absl::Status Nack(const std::string& lease_id, const std::string& reason) override {
    v1::NackBatchRequest request;
    request.set_lease_id(lease_id);
    request.set_reason(reason.substr(0, 1024));
    v1::NackBatchResponse response;
    return Call(
        "NackBatch", [&](grpc::ClientContext* c) { return stub_->NackBatch(c, request, &response); },
        rpc::Retry::kIdempotent);
  }

 private:
  std::unique_ptr<v1::BufferService::Stub> stub_;
};

}  // namespace rlfleet::trainer

#endif  // RLFLEET_SERVICES_TRAINER_BUFFER_CLIENT_H_

// gRPC adapter for BufferCore (BufferService). StreamExperiences is not served yet
// (UNIMPLEMENTED); producers use PutExperiences. Thread-safe.
#ifndef RLFLEET_SERVICES_BUFFER_BUFFER_SERVICE_H_
#define RLFLEET_SERVICES_BUFFER_BUFFER_SERVICE_H_

#include "libs/rpc/server_call.h"
#include "rlfleet/v1/buffer.grpc.pb.h"
#include "services/buffer/buffer_core.h"

namespace rlfleet::buffer {

class BufferServiceImpl final : public v1::BufferService::CallbackService {
 public:
  BufferServiceImpl(BufferCore* core, rpc::CallAuth auth) : core_(core), auth_(std::move(auth)) {}

  grpc::ServerUnaryReactor* PutExperiences(grpc::CallbackServerContext* c,
                                           const v1::PutExperiencesRequest* req,
                                           v1::PutExperiencesResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->Put(*req, resp); });
  }
  grpc::ServerUnaryReactor* SampleBatch(grpc::CallbackServerContext* c,
                                        const v1::SampleBatchRequest* req,
                                        v1::SampleBatchResponse* resp) override {
    // May wait up to wait_ms for groups; the caller's deadline should exceed it.
    return rpc::HandleUnary(c, auth_, [&] { return core_->SampleBatch(*req, resp); });
  }
  grpc::ServerUnaryReactor* AckBatch(grpc::CallbackServerContext* c, const v1::AckBatchRequest* req,
                                     v1::AckBatchResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->Ack(*req, resp); });
  }
  grpc::ServerUnaryReactor* NackBatch(grpc::CallbackServerContext* c,
                                      const v1::NackBatchRequest* req,
                                      v1::NackBatchResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->Nack(*req, resp); });
  }
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* c, const v1::GetStatsRequest*,
                                     v1::GetStatsResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->GetStats(resp); });
  }
  grpc::ServerUnaryReactor* Configure(grpc::CallbackServerContext* c,
                                      const v1::ConfigureRequest* req,
                                      v1::ConfigureResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->Configure(*req, resp); });
  }

 private:
  BufferCore* const core_;
  const rpc::CallAuth auth_;
};

}  // namespace rlfleet::buffer

#endif  // RLFLEET_SERVICES_BUFFER_BUFFER_SERVICE_H_

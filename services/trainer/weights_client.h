// Where PublishWeights hands a version on: the weight-broadcast service, so that an
// orchestrator driving the trainer API only calls PublishWeights (the contract in
// trainer.proto). An interface, its gRPC client (WeightsService.PublishVersion, with
// the client base's deadlines and retries) and a fake in the tests. Thread-safe.
#ifndef RLFLEET_SERVICES_TRAINER_WEIGHTS_CLIENT_H_
#define RLFLEET_SERVICES_TRAINER_WEIGHTS_CLIENT_H_

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/rpc/client.h"
#include "rlfleet/v1/trainer.pb.h"
#include "rlfleet/v1/weights.grpc.pb.h"

namespace rlfleet::trainer {

class WeightsSink {
 public:
  virtual ~WeightsSink() = default;
  // Publishes `published` (what this trainer's PublishWeights produced) there, within
  // `timeout`. The weights service's error (UNAVAILABLE when unreachable, DATA_LOSS for
  // a digest it could not match, DEADLINE_EXCEEDED) as it comes.
  virtual absl::Status HandOff(const v1::PublishWeightsResponse& published, absl::Duration timeout) = 0;
};

class GrpcWeightsSink : public WeightsSink, public rpc::ClientBase {
 public:
  GrpcWeightsSink(std::shared_ptr<grpc::Channel> channel, rpc::ClientOptions options, std::string publisher_id)
      : ClientBase(channel, std::move(options)),
        stub_(v1::WeightsService::NewStub(channel)),
        publisher_id_(std::move(publisher_id)) {}

  absl::Status HandOff(const v1::PublishWeightsResponse& published, absl::Duration timeout) override {
    v1::PublishVersionRequest request;
    *request.mutable_manifest() = published.manifest();
    *request.add_sources()->add_shards()->mutable_location() = published.location();
    request.set_trainer_pause_us(static_cast<int64_t>(published.elapsed_ms() * 1000));
    request.set_publisher_id(publisher_id_);
    if (published.has_device_image()) *request.mutable_device_image() = published.device_image();
    v1::PublishVersionResponse response;
    // (the weights service pulls and checks the whole version before it answers; the
    // same version again with the same digest is already published there: idempotent)
    return Call(
        "PublishVersion", [&](grpc::ClientContext* c) { return stub_->PublishVersion(c, request, &response); },
        rpc::Retry::kIdempotent, timeout);
  }

 private:
  std::unique_ptr<v1::WeightsService::Stub> stub_;
  const std::string publisher_id_;
};

}  // namespace rlfleet::trainer

#endif  // RLFLEET_SERVICES_TRAINER_WEIGHTS_CLIENT_H_

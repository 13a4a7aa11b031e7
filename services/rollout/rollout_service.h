// gRPC adapter for RolloutCore: Generate (server streaming), GenerateBatch, GetInfo,
// Drain, Resume, and UpdateWeights through WeightIntake (weight_intake.h: a FILE
// source, a pull over the data plane, or a push by the weights service's resharding
// round; PrepareWeights / CommitWeights as two calls answer UNIMPLEMENTED for now).
// Thread-safe.
#ifndef RLFLEET_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_
#define RLFLEET_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/common/status_macros.h"
#include "libs/metrics/inflight_gauge.h"
#include "libs/rpc/server_call.h"
#include "libs/transport/descriptor_fetcher.h"
#include "libs/transport/transport.h"
#include "rlfleet/v1/rollout.grpc.pb.h"
#include "services/rollout/rollout_core.h"
#include "services/rollout/weight_intake.h"

namespace rlfleet::rollout {

// The call's deadline, or `fallback` from now when the client set none.
inline absl::Time CallDeadline(const grpc::CallbackServerContext& context,
                               absl::Duration fallback = absl::Minutes(10)) {
  const auto deadline = context.deadline();
  const absl::Time latest = absl::Now() + absl::Hours(24);
  if (deadline >= std::chrono::system_clock::now() + std::chrono::hours(24)) return absl::Now() + fallback;
  return std::min(absl::FromChrono(deadline), latest);
}

// Streams one Generate job: the scheduler pushes messages (never blocking), and the
// reactor writes them one at a time; a client that goes away cancels the job.
// StartWrite and Finish are never called with the lock held (gRPC may run
// OnWriteDone inline), and OnDone waits for any pusher still inside Pump.
// It counts itself in `open_streams` from construction to OnDone (which gRPC calls
// once per reactor, however the call ended: finished, cancelled, client gone, deadline).
class GenerateStream : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  // The state the job's sink shares with the reactor (the sink may outlive it).
  struct Shared {
    absl::Mutex mu;
    GenerateStream* reactor ABSL_GUARDED_BY(mu) = nullptr;
    int pushers ABSL_GUARDED_BY(mu) = 0;  // sinks inside reactor->Pump()
    std::deque<v1::GenerateResponse> queue ABSL_GUARDED_BY(mu);
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool done ABSL_GUARDED_BY(mu) = false;      // the job finished: Finish after the queue
    bool finished ABSL_GUARDED_BY(mu) = false;  // Finish called
    absl::Status status ABSL_GUARDED_BY(mu);
  };

  static RolloutCore::StreamSink SinkFor(std::shared_ptr<Shared> shared) {
    return [shared](std::vector<v1::GenerateResponse> messages, bool done, absl::Status status) {
      GenerateStream* reactor = nullptr;
      {
        absl::MutexLock lock(&shared->mu);
        for (auto& m : messages) shared->queue.push_back(std::move(m));
        if (done) {
          shared->done = true;
          shared->status = status;
        }
        reactor = shared->reactor;
        if (reactor != nullptr) ++shared->pushers;
      }
      if (reactor == nullptr) return;
      reactor->Pump();
      absl::MutexLock lock(&shared->mu);
      --shared->pushers;
    };
  }

  GenerateStream(RolloutCore* core, std::shared_ptr<Shared> shared, metrics::InflightGauge* open_streams)
      : core_(core), shared_(std::move(shared)), open_streams_(open_streams) {
    open_streams_->Add();
  }

  // Starts writing (call once the job exists).
  void Start(std::shared_ptr<RolloutCore::Job> job) {
    {
      absl::MutexLock lock(&shared_->mu);
      job_ = std::move(job);
      shared_->reactor = this;
    }
    Pump();
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    std::shared_ptr<RolloutCore::Job> job;
    {
      absl::MutexLock lock(&shared_->mu);
      shared_->writing = false;
      if (!ok && !shared_->finished) {  // the client is gone
        shared_->finished = true;
        finish = true;
        job = job_;
      }
    }
    if (!finish) {
      Pump();
      return;
    }
    if (job != nullptr) core_->Cancel(job);
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed: client gone"));
  }
  void OnCancel() override {
    std::shared_ptr<RolloutCore::Job> job;
    {
      absl::MutexLock lock(&shared_->mu);
      job = job_;
    }
    if (job != nullptr) core_->Cancel(job);
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&shared_->mu);
      shared_->reactor = nullptr;
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu) { return shared_->pushers == 0; };
      shared_->mu.Await(absl::Condition(&idle));
    }
    open_streams_->Remove();
    delete this;
  }

 private:
  // Starts the next write, or finishes the call once the job is done and all is sent.
  void Pump() {
    bool write = false;
    grpc::Status final_status;
    {
      absl::MutexLock lock(&shared_->mu);
      if (shared_->writing || shared_->finished) return;
      if (!shared_->queue.empty()) {
        current_ = std::move(shared_->queue.front());
        shared_->queue.pop_front();
        shared_->writing = true;
        write = true;
      } else if (shared_->done) {
        shared_->finished = true;
        final_status = rpc::ToGrpcStatus(shared_->status);
      } else {
        return;
      }
    }
    if (write) {
      StartWrite(&current_);
    } else {
      Finish(final_status);
    }
  }

  RolloutCore* const core_;
  const std::shared_ptr<Shared> shared_;
  metrics::InflightGauge* const open_streams_;
  std::shared_ptr<RolloutCore::Job> job_;
  v1::GenerateResponse current_;
};

class RolloutServiceImpl final : public v1::RolloutService::CallbackService {
 public:
  // `on_state_change` is told whether the replica serves (the health status follows it).
  // `fetcher` (not owned; may be null) pulls versions sent by memory descriptor;
  // `data_plane` (not owned; may be null) serves relay copies of them.
  RolloutServiceImpl(RolloutCore* core, rpc::CallAuth auth, std::function<void(bool)> on_state_change = {},
                     transport::DescriptorFetcher* fetcher = nullptr, transport::Transport* data_plane = nullptr)
      : core_(core),
        auth_(std::move(auth)),
        on_state_change_(std::move(on_state_change)),
        intake_(core, fetcher, data_plane) {}

  // WeightIntake::PrefaultStaging.
  void PrefaultStaging(uint64_t bytes) { intake_.PrefaultStaging(bytes); }
  // WeightIntake::set_verify_device_images (before serving).
  void SetVerifyDeviceImages(bool verify) { intake_.set_verify_device_images(verify); }

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* c,
                                                           const v1::GenerateRequest* req) override {
    using Failed = rpc::FinishedStream<grpc::ServerWriteReactor<v1::GenerateResponse>>;
    if (absl::Status s = rpc::Authorize(*c, auth_, rpc::Role::kInference, "Generate"); !s.ok()) {
      return new Failed(rpc::ToGrpcStatus(s));
    }
    auto shared = std::make_shared<GenerateStream::Shared>();
    absl::StatusOr<std::shared_ptr<RolloutCore::Job>> job =
        core_->Generate(*req, GenerateStream::SinkFor(shared), CallDeadline(*c));
    if (!job.ok()) return new Failed(rpc::ToGrpcStatus(job.status()));
    auto* stream = new GenerateStream(core_, shared, &open_streams_);
    stream->Start(std::move(*job));
    return stream;
  }
  grpc::ServerUnaryReactor* GenerateBatch(grpc::CallbackServerContext* c, const v1::GenerateBatchRequest* req,
                                          v1::GenerateBatchResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] { return core_->GenerateBatch(*req, resp, CallDeadline(*c)); });
  }
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* c, const v1::GetInfoRequest*,
                                    v1::GetInfoResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] {
      RETURN_IF_ERROR(core_->GetInfo(resp));
      intake_.DescribeDataPlane(resp);
      return absl::OkStatus();
    });
  }
  // A version from a FILE source, pulled, or pushed by a resharding round
  // (WeightIntake::Update); the health status follows the install.
  grpc::ServerUnaryReactor* UpdateWeights(grpc::CallbackServerContext* c, const v1::PrepareWeightsRequest* req,
                                          v1::CommitWeightsResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&]() -> absl::Status {
      RETURN_IF_ERROR(intake_.Update(*req, CallDeadline(*c, absl::Minutes(1)), resp));
      if (on_state_change_) on_state_change_(core_->serving());
      return absl::OkStatus();
    });
  }
  // Two-phase installs are not offered: UpdateWeights stages and installs in one call.
  // Refused with a message (an RPC left to gRPC's default answers UNIMPLEMENTED with none).
  grpc::ServerUnaryReactor* PrepareWeights(grpc::CallbackServerContext* c, const v1::PrepareWeightsRequest*,
                                           v1::PrepareWeightsResponse*) override {
    return rpc::HandleUnary(c, auth_, [] {
      return absl::UnimplementedError("PrepareWeights: use UpdateWeights, which stages and installs in one call");
    });
  }
  grpc::ServerUnaryReactor* CommitWeights(grpc::CallbackServerContext* c, const v1::CommitWeightsRequest*,
                                          v1::CommitWeightsResponse*) override {
    return rpc::HandleUnary(c, auth_, [] {
      return absl::UnimplementedError("CommitWeights: use UpdateWeights, which stages and installs in one call");
    });
  }

  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* c, const v1::DrainRequest* req,
                                  v1::DrainResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] {
      if (on_state_change_) on_state_change_(false);  // stop new work from being routed here
      absl::Status s = core_->Drain(*req, resp);
      if (on_state_change_) on_state_change_(core_->serving());
      return s;
    });
  }
  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* c, const v1::ResumeRequest*,
                                   v1::ResumeResponse* resp) override {
    return rpc::HandleUnary(c, auth_, [&] {
      absl::Status s = core_->Resume(resp);
      if (s.ok() && on_state_change_) on_state_change_(core_->serving());
      return s;
    });
  }

 private:
  RolloutCore* const core_;
  const rpc::CallAuth auth_;
  std::function<void(bool)> on_state_change_;
  WeightIntake intake_;
  // Generate streams between their reactor's construction and its OnDone.
  metrics::InflightGauge open_streams_{"rlfleet_rollout_open_streams",
                                       "Generate streams open (from the call's start to gRPC's OnDone)."};
};

}  // namespace rlfleet::rollout

#endif  // RLFLEET_SERVICES_ROLLOUT_ROLLOUT_SERVICE_H_

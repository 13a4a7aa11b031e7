// Bare gRPC echo servers of the fleet's control-plane RPCs: the same services, methods
// and message shapes as the real ones, each answering with a canned reply (one recorded
// from the real service) and doing nothing else. The load test measures a real service
// against them in the same run, so the ratio is what the service itself costs over gRPC.
#ifndef RLFLEET_LOADTEST_ECHO_SERVICES_H_
#define RLFLEET_LOADTEST_ECHO_SERVICES_H_

#include <utility>
#include <vector>

#include "rlfleet/v1/buffer.grpc.pb.h"
#include "rlfleet/v1/controller.grpc.pb.h"
#include "rlfleet/v1/reward.grpc.pb.h"
#include "rlfleet/v1/rollout.grpc.pb.h"
#include "rlfleet/v1/trainer.grpc.pb.h"

namespace rlfleet::loadtest {

// A unary call answered OK (its reply already filled).
inline grpc::ServerUnaryReactor* FinishedOk(grpc::CallbackServerContext* c) {
  grpc::ServerUnaryReactor* reactor = c->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

// Canned replies; set before the server starts, read-only after.
struct EchoReplies {
  v1::ScoreResponse score;
  v1::PutExperiencesResponse put;
  v1::PutExperiencesResponse stream;  // the reply to a whole StreamExperiences
  v1::GetStateResponse get_state;
  v1::HeartbeatResponse heartbeat;
  std::vector<v1::GenerateResponse> generate;  // the messages of one Generate stream
};

class EchoReward final : public v1::RewardService::CallbackService {
 public:
  explicit EchoReward(const EchoReplies* replies) : replies_(replies) {}
  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* c, const v1::ScoreRequest*,
                                  v1::ScoreResponse* response) override {
    *response = replies_->score;
    return FinishedOk(c);
  }

 private:
  const EchoReplies* const replies_;
};

class EchoBuffer final : public v1::BufferService::CallbackService {
 public:
  explicit EchoBuffer(const EchoReplies* replies) : replies_(replies) {}
  grpc::ServerUnaryReactor* PutExperiences(grpc::CallbackServerContext* c, const v1::PutExperiencesRequest*,
                                           v1::PutExperiencesResponse* response) override {
    *response = replies_->put;
    return FinishedOk(c);
  }
  grpc::ServerReadReactor<v1::PutExperiencesRequest>* StreamExperiences(grpc::CallbackServerContext*,
                                                                        v1::PutExperiencesResponse* response) override {
    // Reads every message, then answers.
    class Reader : public grpc::ServerReadReactor<v1::PutExperiencesRequest> {
     public:
      Reader(const v1::PutExperiencesResponse& reply, v1::PutExperiencesResponse* response)
          : reply_(reply), response_(response) {
        StartRead(&message_);
      }
      void OnReadDone(bool ok) override {
        if (ok) {
          StartRead(&message_);
          return;
        }
        *response_ = reply_;
        Finish(grpc::Status::OK);
      }
      void OnDone() override { delete this; }

     private:
      const v1::PutExperiencesResponse& reply_;
      v1::PutExperiencesResponse* const response_;
      v1::PutExperiencesRequest message_;
    };
    return new Reader(replies_->stream, response);
  }

 private:
  const EchoReplies* const replies_;
};

class EchoTrainer final : public v1::TrainerService::CallbackService {
 public:
  explicit EchoTrainer(const EchoReplies* replies) : replies_(replies) {}
  grpc::ServerUnaryReactor* GetState(grpc::CallbackServerContext* c, const v1::GetStateRequest*,
                                     v1::GetStateResponse* response) override {
    *response = replies_->get_state;
    return FinishedOk(c);
  }

 private:
  const EchoReplies* const replies_;
};

class EchoRegistry final : public v1::RegistryService::CallbackService {
 public:
  explicit EchoRegistry(const EchoReplies* replies) : replies_(replies) {}
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* c, const v1::HeartbeatRequest*,
                                      v1::HeartbeatResponse* response) override {
    *response = replies_->heartbeat;
    return FinishedOk(c);
  }

 private:
  const EchoReplies* const replies_;
};

class EchoRollout final : public v1::RolloutService::CallbackService {
 public:
  explicit EchoRollout(const EchoReplies* replies) : replies_(replies) {}
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext*,
                                                           const v1::GenerateRequest*) override {
    // Writes the recorded messages one after another, then OK.
    class Writer : public grpc::ServerWriteReactor<v1::GenerateResponse> {
     public:
      explicit Writer(const std::vector<v1::GenerateResponse>& messages) : messages_(messages) { Next(); }
      void OnWriteDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client gone"));
          return;
        }
        Next();
      }
      void OnDone() override { delete this; }

     private:
      void Next() {
        if (next_ < messages_.size()) {
          StartWrite(&messages_[next_++]);
        } else {
          Finish(grpc::Status::OK);
        }
      }
      const std::vector<v1::GenerateResponse>& messages_;
      size_t next_ = 0;
    };
    return new Writer(replies_->generate);
  }

 private:
  const EchoReplies* const replies_;
};

}  // namespace rlfleet::loadtest

#endif  // RLFLEET_LOADTEST_ECHO_SERVICES_H_

// gRPC adapter for RewardCore (RewardService). Thread-safe.
#ifndef RLFLEET_SERVICES_REWARD_REWARD_SERVICE_H_
#define RLFLEET_SERVICES_REWARD_REWARD_SERVICE_H_

#include "libs/rpc/server_call.h"
#include "rlfleet/v1/reward.grpc.pb.h"
#include "services/reward/reward_core.h"

namespace rlfleet::reward {

class RewardServiceImpl final : public v1::RewardService::CallbackService {
 public:
  RewardServiceImpl(RewardCore* core, rpc::CallAuth auth) : core_(core), auth_(std::move(auth)) {}

  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* context, const v1::ScoreRequest* request,
                                  v1::ScoreResponse* response) override {
    return rpc::HandleUnary(context, auth_, [&] { return core_->Score(*request, response); });
  }
  grpc::ServerUnaryReactor* ListRewardFunctions(grpc::CallbackServerContext* context,
                                                const v1::ListRewardFunctionsRequest* request,
                                                v1::ListRewardFunctionsResponse* response) override {
    return rpc::HandleUnary(context, auth_, [&] { return core_->List(*request, response); });
  }

 private:
  RewardCore* const core_;
  const rpc::CallAuth auth_;
};

}  // namespace rlfleet::reward

#endif  // RLFLEET_SERVICES_REWARD_REWARD_SERVICE_H_

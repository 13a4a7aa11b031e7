#include "services/controller/run_peers_grpc.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <map>

#include "libs/common/status_macros.h"
#include "rlfleet/v1/buffer.grpc.pb.h"
#include "rlfleet/v1/reward.grpc.pb.h"
#include "rlfleet/v1/rollout.grpc.pb.h"
#include "rlfleet/v1/trainer.grpc.pb.h"
#include "rlfleet/v1/weights.grpc.pb.h"
#include "services/controller/reward_routes.h"

namespace rlfleet::controller {
namespace {

// What every adapter shares: a client of the service with the peers' call deadline.
template <typename Service>
class Peer {
 public:
  Peer(std::shared_ptr<grpc::Channel> channel, const rpc::ClientOptions& options, absl::Duration timeout)
      : client_(std::move(channel), WithTimeout(options, timeout)), timeout_(timeout) {}

 protected:
  using Stub = typename Service::Stub;
  using Retry = rpc::Retry;
  // What a call may ask the peer to spend on work it waits for in turn (a sync round
  // over replicas): less than the call's own deadline, so that the peer answers with
  // what it knows (which replica missed its deadline) before this call runs out.
  int64_t InnerBudgetMs() const {
    const absl::Duration margin = std::min(absl::Seconds(5), timeout_ / 5);
    return std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout_ - margin));
  }
  rpc::ServiceClient<Service> client_;

 private:
  static rpc::ClientOptions WithTimeout(rpc::ClientOptions options, absl::Duration timeout) {
    options.default_timeout = timeout;
    return options;
  }
  const absl::Duration timeout_;
};

class GrpcRolloutReplica : public RolloutReplica, Peer<v1::RolloutService> {
 public:
  GrpcRolloutReplica(std::shared_ptr<grpc::Channel> c, const rpc::ClientOptions& o, absl::Duration t,
                     std::string address)
      : Peer(std::move(c), o, t), address_(std::move(address)) {}
  std::string address() const override { return address_; }
  absl::Status GenerateBatch(const v1::GenerateBatchRequest& request, v1::GenerateBatchResponse* response) override {
    return client_.Unary("GenerateBatch", &Stub::GenerateBatch, request, response, Retry::kOnce);
  }
  absl::Status UpdateWeights(const v1::PrepareWeightsRequest& request) override {
    v1::CommitWeightsResponse response;
    return client_.Unary("UpdateWeights", &Stub::UpdateWeights, request, &response, Retry::kOnce);
  }
  absl::StatusOr<uint64_t> InstalledVersion() override {
    v1::GetInfoResponse info;
    RETURN_IF_ERROR(client_.Unary("GetInfo", &Stub::GetInfo, v1::GetInfoRequest(), &info, Retry::kIdempotent));
    return info.installed_version().version();
  }
  absl::Status Drain() override {
    v1::DrainRequest request;  // grace 0: the pool has nothing in flight on it
    v1::DrainResponse response;
    return client_.Unary("Drain", &Stub::Drain, request, &response, Retry::kIdempotent);
  }

 private:
  const std::string address_;
};

class GrpcRewardPeer : public RewardPeer, Peer<v1::RewardService> {
 public:
  using Peer::Peer;
  absl::Status Score(const v1::ScoreRequest& request, v1::ScoreResponse* response) override {
    return client_.Unary("Score", &Stub::Score, request, response, Retry::kIdempotent);  // (a pure function)
  }
};

class GrpcBufferPeer : public BufferPeer, Peer<v1::BufferService> {
 public:
  using Peer::Peer;
  absl::Status Configure(const v1::ConfigureRequest& request) override {
    v1::ConfigureResponse response;
    return client_.Unary("Configure", &Stub::Configure, request, &response, Retry::kIdempotent);
  }
  absl::Status PutExperiences(const v1::PutExperiencesRequest& request, v1::PutExperiencesResponse* response) override {
    // (ids the buffer has seen stay duplicates: a second attempt adds nothing twice)
    return client_.Unary("PutExperiences", &Stub::PutExperiences, request, response, Retry::kIdempotent);
  }
  absl::StatusOr<v1::GetStatsResponse> Stats() override {
    v1::GetStatsResponse stats;
    RETURN_IF_ERROR(client_.Unary("GetStats", &Stub::GetStats, v1::GetStatsRequest(), &stats, Retry::kIdempotent));
    return stats;
  }
};

class GrpcTrainerPeer : public TrainerPeer, Peer<v1::TrainerService> {
 public:
  using Peer::Peer;
  absl::Status TrainStep(const v1::TrainStepRequest& request, v1::TrainStepResponse* response) override {
    return client_.Unary("TrainStep", &Stub::TrainStep, request, response, Retry::kOnce);
  }
  absl::Status PublishWeights(const v1::PublishWeightsRequest& request, v1::PublishWeightsResponse* response) override {
    return client_.Unary("PublishWeights", &Stub::PublishWeights, request, response, Retry::kOnce);
  }
  absl::StatusOr<uint64_t> PolicyVersion() override {
    v1::GetStateResponse state;
    RETURN_IF_ERROR(client_.Unary("GetState", &Stub::GetState, v1::GetStateRequest(), &state, Retry::kIdempotent));
    return state.policy_version().version();
  }
  absl::Status SaveCheckpoint(const v1::SaveCheckpointRequest& request, v1::SaveCheckpointResponse* response) override {
    return client_.Unary("SaveCheckpoint", &Stub::SaveCheckpoint, request, response, Retry::kOnce);
  }
};

class GrpcWeightsRoute : public WeightsRoute, Peer<v1::WeightsService> {
 public:
  using Peer::Peer;
  // Registers the replica as a destination (idempotent).
  absl::Status Register(const std::string& replica_address) {
    v1::RegisterDestinationRequest reg;
    reg.set_replica_id(replica_address);
    reg.set_grpc_address(replica_address);
    reg.set_can_relay(true);  // rollout replicas serve what they installed to others
    v1::RegisterDestinationResponse registered;
    return client_.Unary("RegisterDestination", &Stub::RegisterDestination, reg, &registered, Retry::kIdempotent);
  }
  absl::Status Publish(const v1::PublishWeightsResponse& published) override {
    v1::PublishVersionRequest request;
    *request.mutable_manifest() = published.manifest();
    *request.add_sources()->add_shards()->mutable_location() = published.location();
    request.set_trainer_pause_us(static_cast<int64_t>(published.elapsed_ms() * 1000));
    if (published.has_device_image()) *request.mutable_device_image() = published.device_image();
    v1::PublishVersionResponse response;
    return client_.Unary("PublishVersion", &Stub::PublishVersion, request, &response, Retry::kIdempotent);
  }
  std::vector<absl::Status> InstallAll(const std::vector<std::string>& replica_addresses,
                                       const v1::PrepareWeightsRequest& request) override {
    std::vector<absl::Status> out(replica_addresses.size());
    v1::SyncVersionRequest sync;
    sync.set_version(request.manifest().version().version());
    sync.set_commit(true);
    // (a replica that hangs fails alone: the others' statuses come back in time)
    sync.set_timeout_ms(InnerBudgetMs());
    for (size_t i = 0; i < replica_addresses.size(); ++i) {
      out[i] = Register(replica_addresses[i]);
      if (out[i].ok()) sync.add_replica_ids(replica_addresses[i]);
    }
    if (sync.replica_ids_size() == 0) return out;
    v1::SyncVersionResponse synced;
    const absl::Status s = client_.Unary("SyncVersion", &Stub::SyncVersion, sync, &synced, Retry::kOnce);
    std::map<std::string, absl::Status> by_id;
    for (const v1::DestinationSyncStatus& d : synced.destinations()) {
      by_id[d.replica_id()] = d.phase() == v1::SYNC_PHASE_INSTALLED
                                  ? absl::OkStatus()
                                  : absl::Status(d.error_code() > 0 && d.error_code() <= 16  // (a code gRPC knows)
                                                     ? static_cast<absl::StatusCode>(d.error_code())
                                                     : absl::StatusCode::kUnknown,
                                                 d.error());
    }
    for (size_t i = 0; i < replica_addresses.size(); ++i) {
      if (!out[i].ok()) continue;
      auto it = by_id.find(replica_addresses[i]);
      out[i] = !s.ok()             ? s
               : it != by_id.end() ? it->second
                                   : absl::InternalError("the weights service reported no status for the replica");
    }
    return out;
  }
  absl::Status Install(const std::string& replica_address, const v1::PrepareWeightsRequest& request) override {
    RETURN_IF_ERROR(Register(replica_address));
    v1::SyncVersionRequest sync;
    sync.set_replica_id(replica_address);
    sync.set_version(request.manifest().version().version());
    sync.set_timeout_ms(InnerBudgetMs());
    sync.set_commit(true);
    v1::SyncVersionResponse synced;
    return client_.Unary("SyncVersion", &Stub::SyncVersion, sync, &synced, Retry::kOnce);
  }
};

class TrainerThroughWeights : public TrainerPeer {
 public:
  TrainerThroughWeights(std::unique_ptr<TrainerPeer> inner, std::shared_ptr<WeightsRoute> route)
      : inner_(std::move(inner)), route_(std::move(route)) {}
  absl::Status TrainStep(const v1::TrainStepRequest& request, v1::TrainStepResponse* response) override {
    return inner_->TrainStep(request, response);
  }
  absl::Status PublishWeights(const v1::PublishWeightsRequest& request, v1::PublishWeightsResponse* response) override {
    RETURN_IF_ERROR(inner_->PublishWeights(request, response));
    return common::Annotate(route_->Publish(*response), "weights service PublishVersion");
  }
  absl::StatusOr<uint64_t> PolicyVersion() override { return inner_->PolicyVersion(); }
  absl::Status SaveCheckpoint(const v1::SaveCheckpointRequest& request, v1::SaveCheckpointResponse* response) override {
    return inner_->SaveCheckpoint(request, response);
  }

 private:
  const std::unique_ptr<TrainerPeer> inner_;
  const std::shared_ptr<WeightsRoute> route_;
};

class ReplicaThroughWeights : public RolloutReplica {
 public:
  ReplicaThroughWeights(std::unique_ptr<RolloutReplica> inner, std::shared_ptr<WeightsRoute> route)
      : inner_(std::move(inner)), route_(std::move(route)) {}
  std::string address() const override { return inner_->address(); }
  absl::Status GenerateBatch(const v1::GenerateBatchRequest& request, v1::GenerateBatchResponse* response) override {
    return inner_->GenerateBatch(request, response);
  }
  absl::Status UpdateWeights(const v1::PrepareWeightsRequest& request) override {
    return route_->Install(inner_->address(), request);
  }
  std::vector<absl::Status> UpdateWeightsTogether(const std::vector<RolloutReplica*>& replicas,
                                                  const v1::PrepareWeightsRequest& request) override {
    std::vector<std::string> addresses;
    for (RolloutReplica* r : replicas) {
      auto* through = dynamic_cast<ReplicaThroughWeights*>(r);
      if (through == nullptr || through->route_ != route_) {  // (not all through this route: one by one)
        return RolloutReplica::UpdateWeightsTogether(replicas, request);
      }
      addresses.push_back(r->address());
    }
    return route_->InstallAll(addresses, request);
  }
  absl::StatusOr<uint64_t> InstalledVersion() override { return inner_->InstalledVersion(); }
  absl::Status Drain() override { return inner_->Drain(); }

 private:
  const std::unique_ptr<RolloutReplica> inner_;
  const std::shared_ptr<WeightsRoute> route_;
};

// Makes an adapter of type `Impl` over a channel to `address`.
template <typename Interface, typename Impl, typename... Extra>
absl::StatusOr<std::unique_ptr<Interface>> Make(const rpc::ClientOptions& options, const std::string& address,
                                                absl::Duration timeout, Extra... extra) {
  rpc::ClientOptions o = options;
  o.target = address;
  auto channel = rpc::MakeChannel(o);
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<Interface>(new Impl(*channel, o, timeout, extra...));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RolloutReplica>> NewGrpcRolloutReplica(const rpc::ClientOptions& options,
                                                                      const std::string& address,
                                                                      absl::Duration timeout) {
  return Make<RolloutReplica, GrpcRolloutReplica>(options, address, timeout, address);
}

absl::StatusOr<std::unique_ptr<RewardPeer>> NewGrpcRewardPeer(const rpc::ClientOptions& options,
                                                              const std::string& address, absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::unique_ptr<RewardPeer> peer, (Make<RewardPeer, GrpcRewardPeer>(options, address, timeout)));
  // (a step's batch in calls that fit the peer's message limit: the fleet's --max_message_bytes)
  const int limit = std::max(options.max_message_bytes, 2 * static_cast<int>(kScoreMessageMargin));
  return std::unique_ptr<RewardPeer>(
      std::make_unique<SplitReward>(std::move(peer), kMaxScoreItems, static_cast<size_t>(limit) - kScoreMessageMargin));
}

absl::StatusOr<std::unique_ptr<BufferPeer>> NewGrpcBufferPeer(const rpc::ClientOptions& options,
                                                              const std::string& address, absl::Duration timeout) {
  return Make<BufferPeer, GrpcBufferPeer>(options, address, timeout);
}

absl::StatusOr<std::unique_ptr<TrainerPeer>> NewGrpcTrainerPeer(const rpc::ClientOptions& options,
                                                                const std::string& address, absl::Duration timeout) {
  return Make<TrainerPeer, GrpcTrainerPeer>(options, address, timeout);
}

absl::StatusOr<std::shared_ptr<WeightsRoute>> WeightsRoute::Connect(const rpc::ClientOptions& options,
                                                                    const std::string& address,
                                                                    absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::unique_ptr<WeightsRoute> route,
                   (Make<WeightsRoute, GrpcWeightsRoute>(options, address, timeout)));
  return std::shared_ptr<WeightsRoute>(std::move(route));
}

std::unique_ptr<TrainerPeer> PublishThrough(std::unique_ptr<TrainerPeer> trainer, std::shared_ptr<WeightsRoute> route) {
  return std::make_unique<TrainerThroughWeights>(std::move(trainer), std::move(route));
}

std::unique_ptr<RolloutReplica> InstallThrough(std::unique_ptr<RolloutReplica> replica,
                                               std::shared_ptr<WeightsRoute> route) {
  return std::make_unique<ReplicaThroughWeights>(std::move(replica), std::move(route));
}

}  // namespace rlfleet::controller

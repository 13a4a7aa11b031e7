// The load test's callers: one asynchronous call of each control-plane RPC in the
// message shapes of a real fleet, the same for a service and its echo (open_loop.h's
// IssueFn), and the shapes themselves.
#ifndef RLFLEET_LOADTEST_CALLERS_H_
#define RLFLEET_LOADTEST_CALLERS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loadtest/open_loop.h"
#include "rlfleet/v1/buffer.grpc.pb.h"
#include "rlfleet/v1/controller.grpc.pb.h"
#include "rlfleet/v1/reward.grpc.pb.h"
#include "rlfleet/v1/rollout.grpc.pb.h"
#include "rlfleet/v1/trainer.grpc.pb.h"

namespace rlfleet::loadtest {

inline constexpr auto kCallDeadline = std::chrono::seconds(10);
inline constexpr int kGroupSize = 8;  // experiences per GRPO group

using Channels = std::vector<std::shared_ptr<grpc::Channel>>;

// `n` channels to `address`, each its own connection.
Channels Connect(const std::string& address, int n);

// A serial no group has had (experience ids stay unique across calls and levels).
int64_t NextGroupSerial();
// A GRPO group as a producer sends it: 8 scored experiences, 16 prompt and 32 response
// tokens each, ids unique per `serial`.
std::vector<v1::Experience> Group(int64_t serial);
v1::ScoreRequest ScoreShape();                  // 8 items of a group
v1::GenerateRequest GenerateShape(int tokens);  // one sample of `tokens` tokens

struct SimulatedReplica {
  std::string id;
  std::string lease;
};

// Each call: reward Score; buffer PutExperiences (a group; BAD_REPLY unless all 8 are
// accepted); StreamExperiences (the group's 8 experiences one message each); trainer
// GetState; registry Heartbeat cycling through `replicas` (BAD_REPLY unless admitted);
// rollout Generate read to its end (BAD_REPLY without the sample's end). Calls go to
// the channels in turn.
IssueFn ScoreCalls(const Channels& channels);
IssueFn PutCalls(const Channels& channels);
IssueFn StreamCalls(const Channels& channels);
IssueFn GetStateCalls(const Channels& channels);
IssueFn HeartbeatCalls(const Channels& channels, std::shared_ptr<std::vector<SimulatedReplica>> replicas);
IssueFn GenerateCalls(const Channels& channels, int tokens);

}  // namespace rlfleet::loadtest

#endif  // RLFLEET_LOADTEST_CALLERS_H_

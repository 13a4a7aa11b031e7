#include "loadtest/callers.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/model/tokenizer.h"

namespace rlfleet::loadtest {

int64_t NextGroupSerial() {
  static std::atomic<int64_t> next{0};
  return next.fetch_add(1);
}

Channels Connect(const std::string& address, int n) {
  Channels channels;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection per channel
    args.SetMaxReceiveMessageSize(64 << 20);
    channels.push_back(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }
  return channels;
}

namespace {

template <typename Service>
std::vector<std::shared_ptr<typename Service::Stub>> Stubs(const Channels& channels) {
  std::vector<std::shared_ptr<typename Service::Stub>> stubs;
  for (const auto& c : channels) stubs.push_back(Service::NewStub(c));
  return stubs;
}

// Starts one unary call: `invoke(context, response, callback)` calls the stub's async
// method; `keep` (the request) lives until the call ends.
// An OK reply that `good` refuses ends the call as kBadReply.
template <typename Response, typename Keep, typename Invoke>
void StartUnary(
    std::shared_ptr<Keep> keep, Invoke invoke, Done done,
    bool (*good)(const Response&) = [](const Response&) { return true; }) {
  struct Call {
    grpc::ClientContext context;
    Response response;
    std::shared_ptr<Keep> keep;
    Done done;
    bool (*good)(const Response&);
  };
  auto* call = new Call;
  call->keep = std::move(keep);
  call->done = std::move(done);
  call->good = good;
  call->context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  invoke(&call->context, &call->response, [call](const grpc::Status& status) {
    int code = status.error_code();
    if (code == 0 && !call->good(call->response)) code = kBadReply;
    call->done(code);
    delete call;
  });
}

// --- Message shapes -------------------------------------------------------------------

std::vector<int32_t> PromptTokens(const std::string& prompt) {
  auto ids = model::Tokenizer::EncodePrompt(prompt);
  if (!ids.ok()) {
    std::fprintf(stderr, "cannot encode %s: %s\n", prompt.c_str(), ids.status().ToString().c_str());
    std::exit(1);
  }
  return *ids;
}

// A GRPO group as a producer sends it: 8 scored experiences, 16 prompt and 32 response
// tokens each, ids unique per `serial`.

}  // namespace

std::vector<v1::Experience> Group(int64_t serial) {
  std::vector<v1::Experience> group;
  const std::string gid = absl::StrCat("lt-", serial);
  for (int k = 0; k < kGroupSize; ++k) {
    v1::Experience e;
    e.mutable_experience_id()->set_value(absl::StrCat(gid, ":", k));
    e.set_prompt_id(gid);
    e.set_group_id(gid);
    e.set_task("reverse");
    for (int t = 0; t < 16; ++t) e.add_prompt_token_ids(3 + t % 10);
    for (int t = 0; t < 32; ++t) {
      e.add_response_token_ids(3 + (t * 7 + k) % 10);
      e.add_response_logprobs(-0.25f - 0.01f * static_cast<float>(t));
      e.add_token_policy_versions(1);
    }
    e.set_reward(k % 2 == 0 ? 1.0f : 0.0f);
    (*e.mutable_reward_components())["exact"] = e.reward();
    e.set_finish_reason(v1::FINISH_REASON_STOP);
    e.set_created_at_unix_ms(1700000000000);
    group.push_back(std::move(e));
  }
  return group;
}

v1::ScoreRequest ScoreShape() {
  v1::ScoreRequest r;
  for (int k = 0; k < kGroupSize; ++k) {
    v1::ScoreItem* item = r.add_items();
    item->set_item_id(absl::StrCat("lt-score:", k));
    item->set_task("reverse");
    item->set_prompt_text("reverse:48213");
    item->set_response_text(k % 2 == 0 ? "31284" : "31248");
  }
  return r;
}

v1::GenerateRequest GenerateShape(int tokens) {
  v1::GenerateRequest r;
  r.set_request_id("lt-generate");
  r.set_prompt_id("reverse:48213");
  r.set_task("reverse");
  for (int32_t id : PromptTokens("reverse:48213")) r.add_prompt_token_ids(id);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_max_new_tokens(tokens);
  r.mutable_sampling()->set_ignore_eos(true);
  r.set_num_samples(1);
  return r;
}

// --- Callers (the same for the service and its echo) ---------------------------------

IssueFn ScoreCalls(const Channels& channels) {
  auto stubs = Stubs<v1::RewardService>(channels);
  auto request = std::make_shared<const v1::ScoreRequest>(ScoreShape());
  return [stubs, request](int64_t i, Done done) {
    auto* stub = stubs[i % stubs.size()].get();
    StartUnary<v1::ScoreResponse>(
        request, [&](auto* c, auto* r, auto cb) { stub->async()->Score(c, request.get(), r, std::move(cb)); },
        std::move(done));
  };
}

IssueFn PutCalls(const Channels& channels) {
  auto stubs = Stubs<v1::BufferService>(channels);
  return [stubs](int64_t i, Done done) {
    auto request = std::make_shared<v1::PutExperiencesRequest>();
    for (v1::Experience& e : Group(NextGroupSerial())) *request->add_experiences() = std::move(e);
    request->set_producer_id("loadtest");
    auto* stub = stubs[i % stubs.size()].get();
    StartUnary<v1::PutExperiencesResponse>(
        request, [&](auto* c, auto* r, auto cb) { stub->async()->PutExperiences(c, request.get(), r, std::move(cb)); },
        std::move(done), [](const v1::PutExperiencesResponse& r) { return r.accepted() == kGroupSize; });
  };
}

namespace {

// One StreamExperiences call: a producer streams a group's 8 trajectories, one message
// each as it finishes, then closes the stream and reads the summed reply.
class GroupStream : public grpc::ClientWriteReactor<v1::PutExperiencesRequest> {
 public:
  GroupStream(v1::BufferService::Stub* stub, Done done) : done_(std::move(done)) {
    for (v1::Experience& e : Group(NextGroupSerial())) {
      v1::PutExperiencesRequest m;
      m.set_producer_id("loadtest");
      *m.add_experiences() = std::move(e);
      messages_.push_back(std::move(m));
    }
    context_.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    stub->async()->StreamExperiences(&context_, &reply_, this);
    Next();
    StartCall();
  }
  void OnWriteDone(bool ok) override {
    if (ok) Next();  // else OnDone follows with the status
  }
  void OnDone(const grpc::Status& status) override {
    int code = status.error_code();
    if (code == 0 && reply_.accepted() != kGroupSize) code = kBadReply;
    done_(code);
    delete this;
  }

 private:
  void Next() {
    if (next_ < messages_.size()) {
      StartWrite(&messages_[next_++]);
    } else {
      StartWritesDone();
    }
  }
  grpc::ClientContext context_;
  v1::PutExperiencesResponse reply_;
  std::vector<v1::PutExperiencesRequest> messages_;
  size_t next_ = 0;
  Done done_;
};

}  // namespace

IssueFn StreamCalls(const Channels& channels) {
  auto stubs = Stubs<v1::BufferService>(channels);
  return [stubs](int64_t i, Done done) { new GroupStream(stubs[i % stubs.size()].get(), std::move(done)); };
}

IssueFn GetStateCalls(const Channels& channels) {
  auto stubs = Stubs<v1::TrainerService>(channels);
  auto request = std::make_shared<const v1::GetStateRequest>();
  return [stubs, request](int64_t i, Done done) {
    auto* stub = stubs[i % stubs.size()].get();
    StartUnary<v1::GetStateResponse>(
        request, [&](auto* c, auto* r, auto cb) { stub->async()->GetState(c, request.get(), r, std::move(cb)); },
        std::move(done));
  };
}

// Heartbeats cycle through `replicas` (a heartbeat of an unknown lease is NOT_FOUND).
IssueFn HeartbeatCalls(const Channels& channels, std::shared_ptr<std::vector<SimulatedReplica>> replicas) {
  auto stubs = Stubs<v1::RegistryService>(channels);
  auto next = std::make_shared<std::atomic<int64_t>>(0);
  return [stubs, replicas, next](int64_t i, Done done) {
    const SimulatedReplica& replica = (*replicas)[next->fetch_add(1) % replicas->size()];
    auto request = std::make_shared<v1::HeartbeatRequest>();
    request->set_replica_id(replica.id);
    request->set_lease_id(replica.lease);
    request->mutable_load()->set_active_sequences(static_cast<uint32_t>(i % 64));
    request->mutable_load()->set_utilization(0.5);
    request->mutable_policy_version()->set_version(1);
    auto* stub = stubs[i % stubs.size()].get();
    StartUnary<v1::HeartbeatResponse>(
        request, [&](auto* c, auto* r, auto cb) { stub->async()->Heartbeat(c, request.get(), r, std::move(cb)); },
        std::move(done), [](const v1::HeartbeatResponse& r) { return r.admitted(); });
  };
}

namespace {

// One Generate call: reads the stream to its end.
class GenerateReader : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  GenerateReader(v1::RolloutService::Stub* stub, std::shared_ptr<const v1::GenerateRequest> request, Done done)
      : request_(std::move(request)), done_(std::move(done)) {
    context_.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    stub->async()->Generate(&context_, request_.get(), this);
    StartRead(&message_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (message_.has_finished()) finished_ = true;
    StartRead(&message_);
  }
  void OnDone(const grpc::Status& status) override {
    int code = status.error_code();
    if (code == 0 && !finished_) code = kBadReply;  // OK without the sample's end
    done_(code);
    delete this;
  }

 private:
  grpc::ClientContext context_;
  std::shared_ptr<const v1::GenerateRequest> request_;
  v1::GenerateResponse message_;
  bool finished_ = false;
  Done done_;
};

}  // namespace

IssueFn GenerateCalls(const Channels& channels, int tokens) {
  auto stubs = Stubs<v1::RolloutService>(channels);
  auto request = std::make_shared<const v1::GenerateRequest>(GenerateShape(tokens));
  return [stubs, request](int64_t i, Done done) {
    new GenerateReader(stubs[i % stubs.size()].get(), request, std::move(done));
  };
}

}  // namespace rlfleet::loadtest

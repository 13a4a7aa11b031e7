#include <grpcpp/create_channel.h>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/model/tokenizer.h"
#include "libs/rpc/server_runner.h"
#include "services/rollout/rollout_core.h"
#include "services/rollout/rollout_service.h"

namespace rlfleet::rollout {
namespace {

model::PolicyConfig Small() {
  model::PolicyConfig c;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.max_seq_len = 32;
  return c;
}

v1::GenerateBatchRequest Request(int samples = 2) {
  v1::GenerateBatchRequest r;
  r.set_request_id("req-1");
  r.set_num_samples(samples);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_max_new_tokens(8);
  r.mutable_sampling()->set_seed(5);
  for (const char* p : {"reverse:123", "add:1+2"}) {
    v1::BatchPrompt* bp = r.add_prompts();
    bp->set_prompt_id(p);
    bp->set_task(std::string(p).substr(0, std::string(p).find(':')));
    const auto ids = model::Tokenizer::EncodePrompt(p);  // kept alive for the loop
    for (int32_t id : *ids) bp->add_prompt_token_ids(id);
  }
  return r;
}

TEST(RolloutCore, WaitsForWeightsThenGeneratesTaggedExperiences) {
  auto core = RolloutCore::Create(Small(), "cpu");
  ASSERT_TRUE(core.ok()) << core.status();
  v1::GenerateBatchResponse response;
  EXPECT_EQ((*core)->GenerateBatch(Request(), &response).code(), absl::StatusCode::kFailedPrecondition);
  v1::GetInfoResponse info;
  ASSERT_TRUE((*core)->GetInfo(&info).ok());
  EXPECT_EQ(info.state(), v1::REPLICA_SERVING_STATE_WAITING_FOR_WEIGHTS);

  ASSERT_TRUE((*core)->InstallInitial(3).ok());
  { absl::Status gs = (*core)->GenerateBatch(Request(), &response); ASSERT_TRUE(gs.ok()) << gs; }
  ASSERT_EQ(response.completions_size(), 4);  // 2 prompts x 2 samples
  for (const v1::Experience& e : response.completions()) {
    ASSERT_FALSE(e.response_token_ids().empty());
    EXPECT_EQ(e.response_logprobs_size(), e.response_token_ids_size());
    ASSERT_EQ(e.token_policy_versions_size(), e.response_token_ids_size());
    for (uint64_t v : e.token_policy_versions()) EXPECT_EQ(v, 3u);
    EXPECT_NE(e.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  }
  EXPECT_EQ(response.completions(3).experience_id().value(), "req-1:1:1");
  EXPECT_EQ(response.completions(2).group_id(), "add:1+2");
  // Same seed, same tokens.
  v1::GenerateBatchResponse again;
  ASSERT_TRUE((*core)->GenerateBatch(Request(), &again).ok());
  const auto& a = again.completions(0).response_token_ids();
  const auto& b = response.completions(0).response_token_ids();
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.end()), std::vector<int32_t>(b.begin(), b.end()));
}

TEST(RolloutCore, LimitsAndStatesAreClearErrors) {
  auto core = RolloutCore::Create(Small(), "cpu", RolloutLimits{2, 4, 16});
  ASSERT_TRUE((*core)->InstallInitial(1).ok());
  EXPECT_EQ((*core)->InstallInitial(1).code(), absl::StatusCode::kFailedPrecondition);
  v1::GenerateBatchResponse r;
  auto too_many = Request(3);  // 2 x 3 = 6 > 4 sequences
  absl::Status s = (*core)->GenerateBatch(too_many, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "limit of 4 sequences")) << s;
  auto long_gen = Request();
  long_gen.mutable_sampling()->set_max_new_tokens(17);
  EXPECT_TRUE(absl::StrContains((*core)->GenerateBatch(long_gen, &r).message(), "max_new_tokens 17"));
  auto newer = Request();
  newer.set_min_policy_version(2);
  EXPECT_EQ((*core)->GenerateBatch(newer, &r).code(), absl::StatusCode::kFailedPrecondition);
  v1::DrainResponse drained;
  ASSERT_TRUE((*core)->Drain({}, &drained).ok());
  EXPECT_EQ((*core)->GenerateBatch(Request(), &r).code(), absl::StatusCode::kUnavailable);
  v1::ResumeResponse resumed;
  ASSERT_TRUE((*core)->Resume(&resumed).ok());
  EXPECT_EQ(resumed.state(), v1::REPLICA_SERVING_STATE_SERVING);
  EXPECT_TRUE((*core)->GenerateBatch(Request(), &r).ok());
}

TEST(RolloutService, GeneratesOverGrpcAndHealthFollowsTheState) {
  auto core = RolloutCore::Create(Small(), "cpu");
  ASSERT_TRUE((*core)->InstallInitial(1).ok());
  rpc::ServerRunner runner(rpc::ServerOptions{});
  RolloutServiceImpl service(core->get(), rpc::CallAuth{}, [&](bool serving) { runner.SetServing(serving); });
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  auto stub = v1::RolloutService::NewStub(grpc::CreateChannel(runner.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext c1;
  c1.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GenerateBatchResponse response;
  grpc::Status status = stub->GenerateBatch(&c1, Request(), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.completions_size(), 4);
  EXPECT_GT(response.generated_tokens(), 0u);
  grpc::ClientContext c2;
  c2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub->GetInfo(&c2, {}, &info).ok());
  EXPECT_EQ(info.model().d_model(), 32u);
  EXPECT_GT(info.model().num_parameters(), 0u);
  EXPECT_EQ(info.installed_version().version(), 1u);
  auto bad = Request();
  bad.mutable_prompts(0)->add_prompt_token_ids(77);
  grpc::ClientContext c3;
  c3.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  status = stub->GenerateBatch(&c3, bad, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "vocabulary")) << status.error_message();
}

}  // namespace
}  // namespace rlfleet::rollout

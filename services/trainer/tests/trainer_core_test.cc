#include "services/trainer/trainer_core.h"

#include <cmath>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/model/test_util.h"
#include "libs/model/tokenizer.h"
#include "services/buffer/buffer_core.h"

namespace rlfleet::trainer {
namespace {

model::PolicyConfig Small() { return model::TinyConfig(); }

// A BufferSource over an in-process BufferCore.
class CoreSource : public BufferSource {
 public:
  explicit CoreSource(buffer::BufferCore* core) : core_(core) {}
  absl::Status Sample(const v1::SampleBatchRequest& r, v1::SampleBatchResponse* out) override {
    return core_->SampleBatch(r, out);
  }
  absl::Status Ack(const std::string& lease) override {
    v1::AckBatchRequest r;
    r.set_lease_id(lease);
    v1::AckBatchResponse out;
    return core_->Ack(r, &out);
  }
  absl::Status Nack(const std::string& lease, const std::string&) override {
    v1::NackBatchRequest r;
    r.set_lease_id(lease);
    v1::NackBatchResponse out;
    return core_->Nack(r, &out);
  }

 private:
  buffer::BufferCore* core_;
};

v1::Experience Exp(const std::string& id, const std::string& group, float reward, bool bad = false) {
  v1::Experience e;
  e.mutable_experience_id()->set_value(id);
  e.set_group_id(group);
  const auto prompt = model::Tokenizer::EncodePrompt("reverse:12");
  for (int32_t t : *prompt) e.add_prompt_token_ids(t);
  const auto response = model::Tokenizer::EncodeResponse("21");
  for (int32_t t : *response) {
    e.add_response_token_ids(t);
    e.add_response_logprobs(-3.0f);
    e.add_token_policy_versions(1);
  }
  if (bad) e.add_response_logprobs(-1.0f);
  e.set_reward(reward);
  return e;
}

TEST(TrainerCore, InlineStepUpdatesStepVersionAndMetrics) {
  auto core = TrainerCore::Create(Small(), "cpu", 1);
  ASSERT_TRUE(core.ok()) << core.status();
  v1::TrainStepRequest request;
  for (int i = 0; i < 4; ++i) *request.mutable_inline_batch()->add_experiences() = Exp(absl::StrCat("e", i), "g", i % 2);
  request.set_expected_step(1);
  v1::TrainStepResponse response;
  absl::Status s = (*core)->TrainStep(request, &response);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(response.step(), 1u);
  EXPECT_EQ(response.new_policy_version().version(), 2u);
  EXPECT_EQ(response.metrics().sequences(), 4u);
  EXPECT_EQ(response.metrics().tokens(), 12u);  // "21" + EOS, 4 times
  EXPECT_FLOAT_EQ(response.metrics().reward_mean(), 0.5f);
  // A retried step that already ran is refused.
  v1::TrainStepResponse again;
  EXPECT_EQ((*core)->TrainStep(request, &again).code(), absl::StatusCode::kFailedPrecondition);
  v1::GetStateResponse state;
  ASSERT_TRUE((*core)->GetState(&state).ok());
  EXPECT_EQ(state.step(), 1u);
  EXPECT_EQ(state.last_metrics().sequences(), 4u);
}

TEST(TrainerCore, BufferBatchesAreAckedAndFailedStepsNackedSoNothingIsLost) {
  buffer::BufferCore buffer;
  v1::ConfigureRequest c;
  c.set_group_size(2);
  v1::ConfigureResponse cr;
  ASSERT_TRUE(buffer.Configure(c, &cr).ok());
  CoreSource source(&buffer);
  auto core = TrainerCore::Create(Small(), "cpu", 1, &source);
  v1::PutExperiencesRequest put;
  *put.add_experiences() = Exp("a1", "A", 1);
  *put.add_experiences() = Exp("a2", "A", 0);
  v1::PutExperiencesResponse pr;
  ASSERT_TRUE(buffer.Put(put, &pr).ok());
  v1::TrainStepRequest request;
  request.mutable_buffer()->set_num_groups(1);
  v1::TrainStepResponse response;
  ASSERT_TRUE((*core)->TrainStep(request, &response).ok());
  EXPECT_FALSE(response.lease_id().empty());
  v1::GetStatsResponse stats;
  ASSERT_TRUE(buffer.GetStats(&stats).ok());
  EXPECT_EQ(stats.consumed_total(), 2u);
  // No groups left: the step says so (UNAVAILABLE: retry), and takes nothing.
  EXPECT_EQ((*core)->TrainStep(request, &response).code(), absl::StatusCode::kUnavailable);

  // A step that fails after sampling (sequences longer than the model) nacks its
  // lease: the group is back in the buffer, not lost.
  v1::PutExperiencesRequest long_put;
  for (const char* id : {"b1", "b2"}) {
    v1::Experience e = Exp(id, "B", id[1] == '1' ? 1.0f : 0.0f);
    for (int i = 0; i < 40; ++i) {
      e.add_response_token_ids(9);
      e.add_response_logprobs(-1.0f);
      e.add_token_policy_versions(1);
    }
    *long_put.add_experiences() = e;
  }
  ASSERT_TRUE(buffer.Put(long_put, &pr).ok());
  ASSERT_EQ(pr.accepted(), 2u);
  EXPECT_EQ((*core)->TrainStep(request, &response).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(buffer.GetStats(&stats).ok());
  EXPECT_EQ(stats.complete_groups(), 1u);
  EXPECT_EQ(stats.open_leases(), 0u);
}

TEST(TrainerCore, CheckpointRoundTripRestoresWeightsAndState) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/ckpt";
  auto core = TrainerCore::Create(Small(), "cpu", 1);
  v1::TrainStepRequest request;
  for (int i = 0; i < 4; ++i) *request.mutable_inline_batch()->add_experiences() = Exp(absl::StrCat("e", i), "g", i % 2);
  v1::TrainStepResponse response;
  ASSERT_TRUE((*core)->TrainStep(request, &response).ok());
  v1::SaveCheckpointRequest save;
  save.set_path(dir);
  v1::SaveCheckpointResponse saved;
  ASSERT_TRUE((*core)->SaveCheckpoint(save, &saved).ok());
  EXPECT_EQ(saved.step(), 1u);
  EXPECT_GT(saved.size_bytes(), 0u);
  EXPECT_EQ((*core)->SaveCheckpoint(save, &saved).code(), absl::StatusCode::kAlreadyExists);
  const std::vector<std::vector<int32_t>> probe = {*model::Tokenizer::EncodePrompt("reverse:12")};
  const auto at_save = *(*core)->policy()->Logits(probe);
  ASSERT_TRUE((*core)->TrainStep(request, &response).ok());  // moves away
  ASSERT_NE(*(*core)->policy()->Logits(probe), at_save);
  v1::LoadCheckpointRequest load;
  load.set_path(dir);
  v1::LoadCheckpointResponse loaded;
  ASSERT_TRUE((*core)->LoadCheckpoint(load, &loaded).ok());
  EXPECT_EQ(loaded.step(), 1u);
  EXPECT_EQ(loaded.policy_version().version(), 2u);
  EXPECT_EQ(*(*core)->policy()->Logits(probe), at_save);
  load.set_path(dir + "-missing");
  EXPECT_EQ((*core)->LoadCheckpoint(load, &loaded).code(), absl::StatusCode::kNotFound);
}

TEST(TrainerCore, ACheckpointCarriesTheOptimizerAndRefusesCorruptionAndOtherModels) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/ckpt-opt";
  v1::TrainStepRequest request;
  for (int i = 0; i < 4; ++i) *request.mutable_inline_batch()->add_experiences() = Exp(absl::StrCat("e", i), "g", i % 2);
  v1::TrainStepResponse response;
  auto a = TrainerCore::Create(Small(), "cpu", 1);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*a)->TrainStep(request, &response).ok());
  v1::SaveCheckpointRequest save;
  save.set_path(dir);
  v1::SaveCheckpointResponse saved;
  ASSERT_TRUE((*a)->SaveCheckpoint(save, &saved).ok());
  ASSERT_TRUE((*a)->TrainStep(request, &response).ok());
  // Another trainer (another init) resumes from the checkpoint: its next step lands
  // where the first trainer's did (AdamW's moments and step count came along).
  auto b = TrainerCore::Create(Small(), "cpu", 99);
  v1::LoadCheckpointRequest load;
  load.set_path(dir);
  v1::LoadCheckpointResponse loaded;
  ASSERT_TRUE((*b)->LoadCheckpoint(load, &loaded).ok());
  ASSERT_TRUE((*b)->TrainStep(request, &response).ok());
  const std::vector<std::vector<int32_t>> probe = {*model::Tokenizer::EncodePrompt("reverse:12")};
  const auto la = *(*a)->policy()->Logits(probe), lb = *(*b)->policy()->Logits(probe);
  float worst = 0;
  for (size_t i = 0; i < la.size(); ++i) worst = std::max(worst, std::fabs(la[i] - lb[i]));
  EXPECT_LT(worst, 1e-5f);
  // A model of another shape is FAILED_PRECONDITION; a flipped byte is DATA_LOSS.
  model::PolicyConfig other = Small();
  other.d_model = 64;
  auto c = TrainerCore::Create(other, "cpu", 1);
  EXPECT_EQ((*c)->LoadCheckpoint(load, &loaded).code(), absl::StatusCode::kFailedPrecondition);
  {
    std::fstream f(dir + "/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x40;
    f.seekp(-5, std::ios::end);
    f.write(&byte, 1);
  }
  absl::Status corrupt = (*b)->LoadCheckpoint(load, &loaded);
  EXPECT_EQ(corrupt.code(), absl::StatusCode::kDataLoss) << corrupt;
  EXPECT_TRUE(absl::StrContains(corrupt.message(), "optimizer.safetensors")) << corrupt;
}

TEST(TrainerCore, PpoUsesTheValueHeadOrSaysItNeedsOne) {
  v1::TrainStepRequest request;
  for (int i = 0; i < 4; ++i) *request.mutable_inline_batch()->add_experiences() = Exp(absl::StrCat("e", i), "g", i % 2);
  request.mutable_params()->set_algorithm(v1::ALGORITHM_PPO);
  v1::TrainStepResponse response;
  auto plain = TrainerCore::Create(Small(), "cpu", 1);
  absl::Status s = (*plain)->TrainStep(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "value_head")) << s;
  model::PolicyConfig c = Small();
  c.value_head = true;
  auto critic = TrainerCore::Create(c, "cpu", 1);
  ASSERT_TRUE((*critic)->TrainStep(request, &response).ok());
  EXPECT_GT(response.metrics().value_loss(), 0.0f);
  EXPECT_EQ(response.step(), 1u);
  request.mutable_params()->set_gamma(1.5f);
  EXPECT_EQ((*critic)->TrainStep(request, &response).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TrainerCore, BadBatchesAreInvalidArgumentNamingTheField) {
  auto core = TrainerCore::Create(Small(), "cpu", 1);
  v1::TrainStepRequest empty;
  v1::TrainStepResponse r;
  EXPECT_EQ((*core)->TrainStep(empty, &r).code(), absl::StatusCode::kInvalidArgument);
  v1::TrainStepRequest bad;
  *bad.mutable_inline_batch()->add_experiences() = Exp("x", "g", 1, /*bad=*/true);
  absl::Status s = (*core)->TrainStep(bad, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "experiences[0].response_logprobs")) << s;
  v1::TrainStepRequest ppo;
  *ppo.mutable_inline_batch()->add_experiences() = Exp("y", "g", 1);
  ppo.mutable_params()->set_algorithm(v1::ALGORITHM_PPO);
  EXPECT_EQ((*core)->TrainStep(ppo, &r).code(), absl::StatusCode::kFailedPrecondition);  // no value head
}

}  // namespace
}  // namespace rlfleet::trainer

// The trainer through its gRPC adapter on a loopback server: every field of every
// request is honoured or refused naming it (NaN refused everywhere; KL and wire dtypes
// this trainer does not do are UNIMPLEMENTED), and a non-finite loss applies nothing.
#include "services/trainer/trainer_service.h"

#include <grpcpp/create_channel.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/model/safetensors.h"
#include "libs/model/test_util.h"
#include "libs/rpc/server_runner.h"

namespace rlfleet::trainer {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Records what it is handed.
class FakeWeightsSink : public WeightsSink {
 public:
  absl::Status HandOff(const v1::PublishWeightsResponse& published, absl::Duration timeout) override {
    versions.push_back(published.version().version());
    timeouts.push_back(timeout);
    return absl::OkStatus();
  }
  std::vector<uint64_t> versions;
  std::vector<absl::Duration> timeouts;
};

// A trainer core behind its gRPC adapter on loopback.
class Served {
 public:
  explicit Served(uint64_t seed = 1, TrainerCore::PublishTarget publish = {}, WeightsSink* weights = nullptr,
                  rpc::CallAuth auth = {}) {
    auto core =
        TrainerCore::Create(model::TinyConfig(), model::TestDevice(), seed, nullptr, nullptr, getenv("TEST_TMPDIR"));
    EXPECT_TRUE(core.ok()) << core.status();
    core_ = std::move(*core);
    service_ = std::make_unique<TrainerServiceImpl>(core_.get(), auth, publish, weights);
    rpc::ServerOptions options;
    options.host = "127.0.0.1";
    runner_ = std::make_unique<rpc::ServerRunner>(options);
    runner_->AddService(service_.get());
    EXPECT_TRUE(runner_->Start().ok());
    stub_ = v1::TrainerService::NewStub(grpc::CreateChannel(runner_->address(), grpc::InsecureChannelCredentials()));
  }

  template <typename Req, typename Resp>
  grpc::Status Call(grpc::Status (v1::TrainerService::Stub::*rpc)(grpc::ClientContext*, const Req&, Resp*),
                    const Req& request, Resp* response, const std::string& bearer = "") {
    grpc::ClientContext c;
    if (!bearer.empty()) c.AddMetadata(rpc::kAuthorizationKey, "Bearer " + bearer);
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return (stub_.get()->*rpc)(&c, request, response);
  }
  grpc::Status Train(const v1::TrainStepRequest& r, v1::TrainStepResponse* out) {
    return Call(&v1::TrainerService::Stub::TrainStep, r, out);
  }
  v1::GetStateResponse State() {
    v1::GetStateResponse out;
    EXPECT_TRUE(Call(&v1::TrainerService::Stub::GetState, v1::GetStateRequest(), &out).ok());
    return out;
  }
  // The weights as floats, by tensor name.
  std::map<std::string, std::vector<float>> Weights() {
    auto tensors = model::ParseSafetensors(core_->policy()->SafetensorsBytes(), "weights");
    EXPECT_TRUE(tensors.ok());
    std::map<std::string, std::vector<float>> out;
    for (const auto& [name, blob] : *tensors) {
      std::vector<float>& v = out[name];
      v.resize(blob.bytes.size() / 4);
      std::memcpy(v.data(), blob.bytes.data(), blob.bytes.size());
    }
    return out;
  }

 private:
  std::unique_ptr<TrainerCore> core_;
  std::unique_ptr<TrainerServiceImpl> service_;
  std::unique_ptr<rpc::ServerRunner> runner_;
  std::unique_ptr<v1::TrainerService::Stub> stub_;
};

float MaxDiff(const std::map<std::string, std::vector<float>>& a, const std::map<std::string, std::vector<float>>& b) {
  float worst = 0;
  for (const auto& [name, x] : a) {
    const std::vector<float>& y = b.at(name);
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
  }
  return worst;
}

// Two GRPO groups of two, responses of different lengths.
v1::TrainStepRequest Batch(float logprob = -3.0f) {
  v1::TrainStepRequest r;
  r.mutable_params()->set_algorithm(v1::ALGORITHM_GRPO);
  for (int i = 0; i < 4; ++i) {
    v1::Experience* e = r.mutable_inline_batch()->add_experiences();
    e->mutable_experience_id()->set_value(absl::StrCat("e", i));
    e->set_group_id(absl::StrCat("g", i / 2));
    for (int t : {1, 4, 5 + i}) e->add_prompt_token_ids(t);
    for (int j = 0; j <= i; ++j) e->add_response_token_ids(6 + (3 * i + j) % 20);
    e->add_response_token_ids(2);
    for (int j = 0; j < e->response_token_ids_size(); ++j) e->add_response_logprobs(logprob);
    e->set_reward(static_cast<float>(i % 2));
  }
  return r;
}

TEST(TrainerService, EveryBadFieldIsRefusedNamingItAndNothingIsApplied) {
  Served t;
  struct Case {
    const char* field;
    grpc::StatusCode code;
    std::function<void(v1::TrainStepRequest*)> set;
  };
  const uint32_t kHuge = std::numeric_limits<uint32_t>::max();
  const std::vector<Case> cases = {
      {"params.entropy_coef", grpc::INVALID_ARGUMENT, [](auto* r) { r->mutable_params()->set_entropy_coef(kNaN); }},
      {"params.entropy_coef", grpc::INVALID_ARGUMENT, [](auto* r) { r->mutable_params()->set_entropy_coef(-1); }},
      {"params.clip_ratio", grpc::INVALID_ARGUMENT, [](auto* r) { r->mutable_params()->set_clip_ratio(kNaN); }},
      {"params.clip_ratio_high", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_params()->set_clip_ratio_high(kInf); }},
      {"params.gamma", grpc::INVALID_ARGUMENT, [](auto* r) { r->mutable_params()->set_gamma(kNaN); }},
      {"params.gamma", grpc::INVALID_ARGUMENT, [](auto* r) { r->mutable_params()->set_gamma(0.9f); }},  // GRPO
      {"params.gae_lambda", grpc::INVALID_ARGUMENT, [](auto* r) { r->mutable_params()->set_gae_lambda(kNaN); }},
      {"params.value_loss_coef", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_params()->set_value_loss_coef(0.5f); }},
      {"params.ppo_epochs", grpc::INVALID_ARGUMENT, [&](auto* r) { r->mutable_params()->set_ppo_epochs(kHuge); }},
      {"params.mini_batches", grpc::INVALID_ARGUMENT, [&](auto* r) { r->mutable_params()->set_mini_batches(kHuge); }},
      {"params.mini_batches", grpc::INVALID_ARGUMENT, [](auto* r) { r->mutable_params()->set_mini_batches(5); }},
      {"params.algorithm", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_params()->set_algorithm(static_cast<v1::Algorithm>(99)); }},
      {"params.advantage_estimator", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_params()->set_advantage_estimator(static_cast<v1::AdvantageEstimator>(42)); }},
      {"params.kl.coef", grpc::UNIMPLEMENTED, [](auto* r) { r->mutable_params()->mutable_kl()->set_coef(0.1f); }},
      {"params.kl.coef", grpc::INVALID_ARGUMENT, [](auto* r) { r->mutable_params()->mutable_kl()->set_coef(kNaN); }},
      {"params.kl.penalty", grpc::UNIMPLEMENTED,
       [](auto* r) { r->mutable_params()->mutable_kl()->set_penalty(v1::KL_PENALTY_IN_LOSS); }},
      {"params.kl.estimator", grpc::UNIMPLEMENTED,
       [](auto* r) { r->mutable_params()->mutable_kl()->set_estimator(v1::KL_ESTIMATOR_K3); }},
      {"params.kl.target", grpc::UNIMPLEMENTED, [](auto* r) { r->mutable_params()->mutable_kl()->set_target(0.01f); }},
      {"params.optimizer.learning_rate", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_params()->mutable_optimizer()->set_learning_rate(kNaN); }},
      {"params.optimizer.beta1", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_params()->mutable_optimizer()->set_beta1(1.0f); }},
      {"params.optimizer.beta2", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_params()->mutable_optimizer()->set_beta2(kNaN); }},
      {"params.optimizer.eps", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_params()->mutable_optimizer()->set_eps(-1e-8f); }},
      {"params.optimizer.weight_decay", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_params()->mutable_optimizer()->set_weight_decay(kNaN); }},
      {"params.optimizer.grad_clip_norm", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_params()->mutable_optimizer()->set_grad_clip_norm(kInf); }},
      {"params.optimizer.warmup_steps", grpc::INVALID_ARGUMENT,
       [&](auto* r) { r->mutable_params()->mutable_optimizer()->set_warmup_steps(kHuge); }},
      {"experiences[2].reward", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_inline_batch()->mutable_experiences(2)->set_reward(kNaN); }},
      {"experiences[1].response_logprobs[0]", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_inline_batch()->mutable_experiences(1)->set_response_logprobs(0, kNaN); }},
      {"experiences[0].extra_tensors", grpc::UNIMPLEMENTED,
       [](auto* r) { r->mutable_inline_batch()->mutable_experiences(0)->add_extra_tensors(); }},
      {"experiences[0].remote_payload", grpc::UNIMPLEMENTED,
       [](auto* r) { r->mutable_inline_batch()->mutable_experiences(0)->mutable_remote_payload(); }},
      {"experiences[3].token_policy_versions", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_inline_batch()->mutable_experiences(3)->add_token_policy_versions(1); }},
      {"experiences[2].response_loss_mask", grpc::INVALID_ARGUMENT,
       [](auto* r) { r->mutable_inline_batch()->mutable_experiences(2)->add_response_loss_mask(true); }},
      {"buffer.num_groups", grpc::INVALID_ARGUMENT, [](auto* r) { r->mutable_buffer()->set_num_groups(0); }},
      {"buffer.wait_ms", grpc::INVALID_ARGUMENT,
       [](auto* r) {
         r->mutable_buffer()->set_num_groups(1);
         r->mutable_buffer()->set_wait_ms(-1);
       }},
  };
  for (const Case& c : cases) {
    v1::TrainStepRequest r = Batch();
    c.set(&r);
    v1::TrainStepResponse out;
    const grpc::Status s = t.Train(r, &out);
    EXPECT_EQ(s.error_code(), c.code) << c.field << ": " << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), c.field)) << c.field << ": " << s.error_message();
  }
  v1::GetStateResponse state = t.State();
  EXPECT_EQ(state.step(), 0u);
  EXPECT_EQ(state.policy_version().version(), 1u);
  v1::TrainStepResponse out;
  const grpc::Status s = t.Train(Batch(), &out);  // the good one still trains
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(out.step(), 1u);
}

TEST(TrainerService, ANonFiniteLossAppliesNothing) {
  Served t;
  const auto before = t.Weights();
  // Behaviour log-probs of -1e30: the ratio overflows, and with a negative advantage
  // the loss is infinite.
  v1::TrainStepResponse out;
  const grpc::Status s = t.Train(Batch(-1e30f), &out);
  EXPECT_EQ(s.error_code(), grpc::INTERNAL) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "non-finite")) << s.error_message();
  EXPECT_EQ(MaxDiff(before, t.Weights()), 0.0f);
  EXPECT_EQ(t.State().step(), 0u);
  EXPECT_EQ(t.State().policy_version().version(), 1u);
}

// One step with `set` applied to a fresh trainer (same seed): its response and weights.
std::pair<v1::TrainStepResponse, std::map<std::string, std::vector<float>>> StepWith(
    const std::function<void(v1::TrainStepRequest*)>& set, int steps = 1) {
  Served t;
  v1::TrainStepResponse out;
  for (int i = 0; i < steps; ++i) {
    v1::TrainStepRequest r = Batch();
    r.mutable_params()->mutable_optimizer()->set_learning_rate(1e-2f);
    set(&r);
    const grpc::Status s = t.Train(r, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  return {out, t.Weights()};
}

TEST(TrainerService, WarmupScalesTheFirstUpdatesLearningRate) {
  const auto initial = Served().Weights();
  const auto plain = StepWith([](auto*) {});
  const auto warm = StepWith([](auto* r) { r->mutable_params()->mutable_optimizer()->set_warmup_steps(4); });
  // AdamW's first update moves a weight by lr * |g| / (|g| + eps) <= lr: at most 1e-2
  // without warmup, 1e-2 / 4 with it.
  const float moved = MaxDiff(initial, plain.second), moved_warm = MaxDiff(initial, warm.second);
  EXPECT_GT(moved, 0.9e-2f);
  EXPECT_LE(moved, 1.01e-2f);
  EXPECT_GT(moved_warm, 0.9e-2f / 4);
  EXPECT_LE(moved_warm, 1.01e-2f / 4);
}

TEST(TrainerService, BetasReachTheOptimizer) {
  // (Adam's first update does not depend on the betas; the second does.)
  const auto a = StepWith([](auto*) {}, 2), b = StepWith([](auto*) {}, 2);
  EXPECT_EQ(MaxDiff(a.second, b.second), 0.0f);  // deterministic
  const auto beta1 = StepWith([](auto* r) { r->mutable_params()->mutable_optimizer()->set_beta1(0.5f); }, 2);
  const auto beta2 = StepWith([](auto* r) { r->mutable_params()->mutable_optimizer()->set_beta2(0.5f); }, 2);
  EXPECT_GT(MaxDiff(a.second, beta1.second), 1e-4f);
  EXPECT_GT(MaxDiff(a.second, beta2.second), 1e-4f);
  EXPECT_GT(MaxDiff(beta1.second, beta2.second), 1e-4f);
}

TEST(TrainerService, MicroBatchesGiveTheWholeBatchsGradient) {
  // With lr 1 and eps 1 AdamW's first update is g / (|g| + 1): the weights after it
  // compare the gradients themselves (a small eps would turn tiny differences of tiny
  // gradients into differences of a whole learning rate).
  auto linear = [](v1::TrainStepRequest* r) {
    r->mutable_params()->mutable_optimizer()->set_learning_rate(1);
    r->mutable_params()->mutable_optimizer()->set_eps(1);
  };
  const auto initial = Served().Weights();
  const auto whole = StepWith(linear);
  EXPECT_GT(MaxDiff(initial, whole.second), 1e-3f);
  for (uint32_t micro : {1u, 3u, 1000u}) {
    const auto parts = StepWith([&](auto* r) {
      linear(r);
      r->mutable_params()->set_micro_batch_size(micro);
    });
    EXPECT_NEAR(parts.first.metrics().grad_norm(), whole.first.metrics().grad_norm(),
                1e-4 * whole.first.metrics().grad_norm())
        << micro;
    EXPECT_NEAR(parts.first.metrics().loss(), whole.first.metrics().loss(), 1e-5) << micro;
    EXPECT_LT(MaxDiff(parts.second, whole.second), 1e-5f) << micro;
  }
}

TEST(TrainerService, MiniBatchesAndEpochsAreThatManyOptimizerSteps) {
  Served t;
  v1::TrainStepRequest r = Batch();
  r.mutable_params()->set_mini_batches(2);
  r.mutable_params()->set_ppo_epochs(3);
  v1::TrainStepResponse out;
  grpc::Status s = t.Train(r, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(out.step(), 1u);  // one step, one version
  v1::SaveCheckpointRequest save;
  save.set_path("mini");
  v1::SaveCheckpointResponse saved;
  s = t.Call(&v1::TrainerService::Stub::SaveCheckpoint, save, &saved);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto optimizer = model::ReadSafetensors(saved.path() + "/optimizer.safetensors");
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  int checked = 0;
  for (const auto& [name, blob] : *optimizer) {
    if (!absl::EndsWith(name, ".step")) continue;
    int64_t steps = 0;
    std::memcpy(&steps, blob.bytes.data(), sizeof(steps));
    EXPECT_EQ(steps, 6) << name;  // 3 epochs x 2 mini-batches
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(TrainerService, ClipRatioHighMakesTheClipAsymmetric) {
  // Behaviour log-probs of -5 against the fresh model's ~-3.5: ratios ~4.5, clipped at
  // 1.2 for the positive-advantage tokens unless clip_ratio_high lets them through.
  auto step = [](float high) {
    Served t;
    v1::TrainStepRequest r = Batch(-5.0f);
    r.mutable_params()->set_clip_ratio_high(high);
    v1::TrainStepResponse out;
    const grpc::Status s = t.Train(r, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out.metrics().clip_fraction();
  };
  EXPECT_GT(step(0), 0.2f);
  EXPECT_EQ(step(10), 0.0f);
}

TEST(TrainerService, PublishHonoursIdempotentTimeoutAndRefusesOtherWireDtypes) {
  FakeWeightsSink sink;
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/publish";
  Served t(1, TrainerCore::PublishTarget{dir}, &sink);
  auto publish = [&](const std::function<void(v1::PublishWeightsRequest*)>& set, v1::PublishWeightsResponse* out) {
    v1::PublishWeightsRequest r;
    set(&r);
    return t.Call(&v1::TrainerService::Stub::PublishWeights, r, out);
  };
  v1::PublishWeightsResponse first, again, forced;
  grpc::Status s = publish([](auto* r) { r->set_wire_dtype(v1::DTYPE_BFLOAT16); }, &first);
  EXPECT_EQ(s.error_code(), grpc::UNIMPLEMENTED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "wire_dtype")) << s.error_message();
  s = publish([](auto* r) { r->set_wire_dtype(v1::DTYPE_INT32); }, &first);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "wire_dtype")) << s.error_message();
  s = publish([](auto* r) { r->set_timeout_ms(-1); }, &first);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "timeout_ms")) << s.error_message();
  EXPECT_TRUE(sink.versions.empty());

  s = publish(
      [](auto* r) {
        r->set_wire_dtype(v1::DTYPE_FLOAT32);
        r->set_timeout_ms(1234);
      },
      &first);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(sink.versions.size(), 1u);
  EXPECT_EQ(sink.timeouts[0], absl::Milliseconds(1234));
  EXPECT_EQ(t.State().published_version().version(), first.version().version());
  // idempotent: the same publication back, not written or handed on again.
  s = publish([](auto* r) { r->set_idempotent(true); }, &again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(again.location().digest().value(), first.location().digest().value());
  EXPECT_EQ(again.manifest().created_at_unix_ms(), first.manifest().created_at_unix_ms());
  EXPECT_EQ(sink.versions.size(), 1u);
  // Not idempotent: published and handed on again (the default deadline).
  s = publish([](auto*) {}, &forced);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(sink.versions.size(), 2u);
  EXPECT_EQ(sink.timeouts[1], TrainerServiceImpl::kDefaultHandOffTimeout);
}

// With roles on, checkpoint paths are the controller's to name: the fleet token trains
// but cannot save or load a checkpoint; the admin token can.
TEST(TrainerServiceTest, CheckpointRpcsAreControllerOnlyWhenRolesAreOn) {
  Served served(1, {}, nullptr, rpc::CallAuth{"fleet", "admin", {}});
  v1::SaveCheckpointRequest save;
  save.set_path("by-fleet");
  v1::SaveCheckpointResponse saved;
  grpc::Status denied = served.Call(&v1::TrainerService::Stub::SaveCheckpoint, save, &saved, "fleet");
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED) << denied.error_message();
  EXPECT_TRUE(absl::StrContains(denied.error_message(), "SaveCheckpoint")) << denied.error_message();
  v1::LoadCheckpointRequest load;
  load.set_path("by-fleet");
  v1::LoadCheckpointResponse loaded;
  EXPECT_EQ(served.Call(&v1::TrainerService::Stub::LoadCheckpoint, load, &loaded, "fleet").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::GetStateResponse state;
  EXPECT_TRUE(served.Call(&v1::TrainerService::Stub::GetState, v1::GetStateRequest(), &state, "fleet").ok());

  save.set_path("by-controller");
  grpc::Status ok = served.Call(&v1::TrainerService::Stub::SaveCheckpoint, save, &saved, "admin");
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

}  // namespace
}  // namespace rlfleet::trainer

#include "libs/model/policy.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/model/safetensors.h"
#include "libs/model/test_util.h"
#include "libs/model/tokenizer.h"

namespace rlfleet::model {
namespace {

PolicyConfig Small() { return TinyConfig(); }

// p(token | prompt) under the policy.
float TokenProbability(Policy& policy, const std::vector<int32_t>& prompt, int32_t token) {
  auto logits = policy.Logits({prompt});
  const int vocab = policy.config().vocab_size;
  const float* last = logits->data() + (prompt.size() - 1) * vocab;
  float m = *std::max_element(last, last + vocab), z = 0;
  for (int i = 0; i < vocab; ++i) z += std::exp(last[i] - m);
  return std::exp(last[token] - m) / z;
}

TEST(Policy, IncrementalDecodingWithTheKvCacheEqualsFullRecomputation) {
  auto policy = Policy::Create(Small(), TestDevice());
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  // Two rows, the second left-padded: PAD keys are masked in both paths.
  std::vector<std::vector<int32_t>> tokens = {{1, 4, 9, 10, 11, 3, 12, 13}, {0, 0, 1, 5, 14, 15, 3, 16}};
  auto full = (*policy)->Logits(tokens);
  auto incremental = (*policy)->IncrementalLogits(tokens);
  ASSERT_TRUE(full.ok() && incremental.ok());
  ASSERT_EQ(full->size(), 2u * 8 * 32);
  EXPECT_LT(MaxAbsDiff(*full, *incremental), 1e-5f);
}

TEST(Policy, SameSeedSameTokensAndGreedyIsDeterministic) {
  auto policy = Policy::Create(Small(), TestDevice(), /*init_seed=*/7);
  ASSERT_TRUE(policy.ok());
  std::vector<std::vector<int32_t>> prompts = {*Tokenizer::EncodePrompt("reverse:123"),
                                               *Tokenizer::EncodePrompt("add:12+34"),
                                               *Tokenizer::EncodePrompt("sort:9")};
  SamplingOptions options;
  options.max_new_tokens = 12;
  options.seed = 42;
  auto a = (*policy)->Generate(prompts, options);
  auto b = (*policy)->Generate(prompts, options);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status();
  ASSERT_EQ(a->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*a)[i].tokens, (*b)[i].tokens);
    EXPECT_EQ((*a)[i].tokens.size(), (*a)[i].logprobs.size());
    for (float lp : (*a)[i].logprobs) {
      EXPECT_LE(lp, 0.0f);
      EXPECT_TRUE(std::isfinite(lp));
    }
    // Each sequence stops on its own: at EOS, or at max_new_tokens.
    if ((*a)[i].stopped_by_eos) {
      EXPECT_EQ((*a)[i].tokens.back(), options.eos_id);
    } else {
      EXPECT_EQ((*a)[i].tokens.size(), 12u);
    }
  }
  options.seed = 43;
  auto c = (*policy)->Generate(prompts, options);
  bool any_different = false;
  for (size_t i = 0; i < 3; ++i) any_different |= (*c)[i].tokens != (*a)[i].tokens;
  EXPECT_TRUE(any_different) << "a different seed should sample differently";
  options.temperature = 0;
  auto g1 = (*policy)->Generate(prompts, options);
  options.seed = 99;
  auto g2 = (*policy)->Generate(prompts, options);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ((*g1)[i].tokens, (*g2)[i].tokens);
}

TEST(Policy, GreedyGenerationMatchesArgmaxOfFullLogits) {
  auto policy = Policy::Create(Small(), TestDevice(), 3);
  ASSERT_TRUE(policy.ok());
  std::vector<int32_t> prompt = *Tokenizer::EncodePrompt("reverse:4567");
  SamplingOptions options;
  options.temperature = 0;
  options.max_new_tokens = 6;
  options.eos_id = -1;  // never stop early
  auto gen = (*policy)->Generate({prompt}, options);
  ASSERT_TRUE(gen.ok());
  // Recompute each step from scratch and compare the argmax.
  std::vector<int32_t> seq = prompt;
  for (size_t step = 0; step < 6; ++step) {
    auto logits = (*policy)->Logits({seq});
    ASSERT_TRUE(logits.ok());
    const float* last = logits->data() + (seq.size() - 1) * 32;
    const int32_t best = static_cast<int32_t>(std::max_element(last, last + 32) - last);
    ASSERT_EQ((*gen)[0].tokens[step], best) << "step " << step;
    seq.push_back(best);
  }
}

// Generation decodes with its own copy of the weights (transposed for the products):
// after a TrainStep and after a load it must follow the new weights, which the full
// forward pass reads directly.
TEST(Policy, GenerationFollowsTheWeightsAfterATrainStepAndALoad) {
  auto policy = Policy::Create(Small(), TestDevice(), 11);
  ASSERT_TRUE(policy.ok());
  const std::vector<int32_t> prompt = *Tokenizer::EncodePrompt("reverse:812");
  SamplingOptions options;
  options.temperature = 0;
  options.max_new_tokens = 5;
  options.eos_id = -1;
  // Each generated token's log-prob against log-softmax of the full forward pass.
  auto max_logprob_error = [&]() {
    auto gen = (*policy)->Generate({prompt}, options);
    EXPECT_TRUE(gen.ok());
    std::vector<int32_t> seq = prompt;
    float worst = 0;
    for (size_t step = 0; step < (*gen)[0].tokens.size(); ++step) {
      auto logits = (*policy)->Logits({seq});
      const float* last = logits->data() + (seq.size() - 1) * 32;
      const float m = *std::max_element(last, last + 32);
      float z = 0;
      for (int i = 0; i < 32; ++i) z += std::exp(last[i] - m);
      const int32_t token = (*gen)[0].tokens[step];
      worst = std::max(worst, std::abs((*gen)[0].logprobs[step] - (last[token] - m - std::log(z))));
      seq.push_back(token);
    }
    return worst;
  };
  const std::string saved = absl::StrCat(testing::TempDir(), "/follow.safetensors");
  ASSERT_TRUE((*policy)->SaveSafetensors(saved).ok());
  EXPECT_LT(max_logprob_error(), 1e-4f);
  TrainOptions train;
  train.learning_rate = 0.05f;  // a large step: stale weights would be far off
  auto gens = (*policy)->Generate({prompt}, options);
  ASSERT_TRUE(gens.ok());
  ASSERT_TRUE((*policy)->TrainStep({{prompt, (*gens)[0].tokens, (*gens)[0].logprobs, 1.0f}}, train).ok());
  EXPECT_LT(max_logprob_error(), 1e-4f) << "after TrainStep";
  ASSERT_TRUE((*policy)->LoadSafetensors(saved).ok());
  EXPECT_LT(max_logprob_error(), 1e-4f) << "after LoadSafetensors";
}

TEST(Policy, WhatASequenceGeneratesDoesNotDependOnItsBatch) {
  // A short prompt left-padded next to a longer one must generate what it generates
  // alone (position embeddings count real tokens only).
  auto policy = Policy::Create(Small(), TestDevice(), 5);
  ASSERT_TRUE(policy.ok());
  std::vector<int32_t> short_prompt = *Tokenizer::EncodePrompt("reverse:45");
  std::vector<int32_t> long_prompt = *Tokenizer::EncodePrompt("reverse:1234567");
  SamplingOptions options;
  options.temperature = 0;
  options.max_new_tokens = 6;
  options.eos_id = -1;
  auto alone = (*policy)->Generate({short_prompt}, options);
  auto batched = (*policy)->Generate({long_prompt, short_prompt}, options);
  ASSERT_TRUE(alone.ok() && batched.ok());
  EXPECT_EQ((*alone)[0].tokens, (*batched)[1].tokens);
  ASSERT_EQ((*alone)[0].logprobs.size(), (*batched)[1].logprobs.size());
  for (size_t i = 0; i < (*alone)[0].logprobs.size(); ++i) {
    EXPECT_NEAR((*alone)[0].logprobs[i], (*batched)[1].logprobs[i], 1e-4) << "token " << i;
  }
}

TEST(Policy, ValuesAreTheValueHeadAtTheLastTokenWhateverTheBatch) {
  PolicyConfig c = Small();
  auto plain = Policy::Create(c, TestDevice());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->Values({{1, 2}}).status().code(), absl::StatusCode::kFailedPrecondition);
  c.value_head = true;
  auto policy = Policy::Create(c, TestDevice(), 4);
  ASSERT_TRUE(policy.ok());
  std::vector<int32_t> a = *Tokenizer::EncodePrompt("reverse:12");
  std::vector<int32_t> b = *Tokenizer::EncodePrompt("reverse:98765");
  auto alone = (*policy)->Values({a});
  auto both = (*policy)->Values({b, a});
  ASSERT_TRUE(alone.ok() && both.ok());
  ASSERT_EQ(both->size(), 2u);
  EXPECT_NEAR((*alone)[0], (*both)[1], 1e-5);
  EXPECT_NE((*both)[0], (*both)[1]);
}

TEST(Policy, LimitsAreInvalidArgumentNamingTheLimit) {
  auto policy = Policy::Create(Small(), TestDevice());
  ASSERT_TRUE(policy.ok());
  SamplingOptions options;
  options.max_new_tokens = 40;
  auto too_long = (*policy)->Generate({{1, 4, 9, 3}}, options);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(too_long.status().message(), "max_seq_len")) << too_long.status();
  options.max_new_tokens = 4;
  EXPECT_TRUE(absl::StrContains((*policy)->Generate({{1, 99}}, options).status().message(), "outside the vocabulary"));
  EXPECT_EQ((*policy)->Generate({}, options).status().code(), absl::StatusCode::kInvalidArgument);
  PolicyConfig bad = Small();
  bad.n_heads = 5;
  EXPECT_EQ(Policy::Create(bad, TestDevice()).status().code(), absl::StatusCode::kInvalidArgument);
}

// A device the backend cannot run on is a clear error at Create, naming the backend
// (the services print the same at start): never a libtorch exception or a crash.
TEST(Policy, ADeviceTheBackendLacksIsAClearErrorNamingTheBackend) {
  EXPECT_TRUE(absl::StrContains(ModelBackend(), "librlfleet_model.so (libtorch ")) << ModelBackend();
  auto tpu = Policy::Create(Small(), "tpu");
  EXPECT_EQ(tpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(tpu.status().message(), "want cpu, cuda or cuda:N")) << tpu.status();
  auto far = Policy::Create(Small(), "cuda:64");  // (no backend sees 65 GPUs)
  EXPECT_EQ(far.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(far.status().message(), "librlfleet_model.so")) << far.status();
  EXPECT_TRUE(Policy::Create(Small(), "cpu").ok());
}

// The layout fingerprint names the flat image's layout: the same for the same shape
// whatever the weights or dtype, another for another shape. A policy on the CPU has no
// device images (the install between processes runs on the GPU: device_image_test).
TEST(Policy, LayoutFingerprintsAndDeviceImagesOnTheCpu) {
  auto a = Policy::Create(Small(), "cpu", 1);
  auto b = Policy::Create(Small(), "cpu", 2);
  PolicyConfig wider = Small();
  wider.d_model *= 2;
  auto c = Policy::Create(wider, "cpu", 1);
  PolicyConfig half = Small();
  half.dtype = "bf16";
  auto d = Policy::Create(half, "cpu", 1);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  EXPECT_EQ((*a)->LayoutFingerprint(), (*b)->LayoutFingerprint());
  EXPECT_EQ((*a)->LayoutFingerprint(), (*d)->LayoutFingerprint());
  EXPECT_NE((*a)->LayoutFingerprint(), (*c)->LayoutFingerprint());
  if (TestDevice() == "cpu") {
    EXPECT_EQ((*a)->ExportDeviceImage(1).status().code(), absl::StatusCode::kFailedPrecondition);
    DeviceImage::Ref ref;
    EXPECT_EQ((*a)->InstallDeviceImage(ref, true).code(), absl::StatusCode::kFailedPrecondition);
  }
}

// A 16-bit policy (a rollout replica's --dtype) takes the F32 image of an fp32 one and
// computes the same logits to 16-bit precision, decodes through its KV cache as it
// computes from scratch, generates, and writes F32 images back; it does not train.
// fp16 is CUDA only: on the CPU it is a clear error at Create.
TEST(Policy, SixteenBitPoliciesLoadF32ImagesAndGenerateButDoNotTrain) {
  auto reference = Policy::Create(Small(), TestDevice(), 3);
  ASSERT_TRUE(reference.ok());
  const std::string image = (*reference)->SafetensorsBytes();
  const std::vector<std::vector<int32_t>> tokens = {{1, 4, 9, 10, 3, 7}, {1, 5, 5, 8, 2, 6}};
  auto want = (*reference)->Logits(tokens);
  ASSERT_TRUE(want.ok());
  const bool cuda = absl::StartsWith(TestDevice(), "cuda");
  for (const std::string dtype : {"bf16", "fp16"}) {
    PolicyConfig c = Small();
    c.dtype = dtype;
    auto policy = Policy::Create(c, TestDevice(), 99);
    if (dtype == "fp16" && !cuda) {
      EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_TRUE(absl::StrContains(policy.status().message(), "fp16 needs a CUDA device")) << policy.status();
      continue;
    }
    ASSERT_TRUE(policy.ok()) << dtype << ": " << policy.status();
    ASSERT_TRUE((*policy)->LoadSafetensorsBytes(image, "reference").ok()) << dtype;
    auto got = (*policy)->Logits(tokens);
    ASSERT_TRUE(got.ok()) << dtype << ": " << got.status();
    // (logits of this model are O(1); bf16 keeps 8 bits of mantissa, fp16 11)
    EXPECT_LT(MaxAbsDiff(*got, *want), dtype == "bf16" ? 0.15f : 0.02f) << dtype;
    EXPECT_GT(MaxAbsDiff(*got, *want), 0.0f) << dtype << " computed in fp32?";
    auto incremental = (*policy)->IncrementalLogits(tokens);
    ASSERT_TRUE(incremental.ok()) << dtype << ": " << incremental.status();
    EXPECT_LT(MaxAbsDiff(*incremental, *got), dtype == "bf16" ? 0.15f : 0.02f) << dtype;
    SamplingOptions options;
    options.max_new_tokens = 6;
    options.seed = 5;
    auto generated = (*policy)->Generate({{1, 4, 9}, {1, 5}}, options);
    ASSERT_TRUE(generated.ok()) << dtype << ": " << generated.status();
    ASSERT_EQ(generated->size(), 2u);
    for (const Generation& g : *generated) {
      EXPECT_FALSE(g.tokens.empty());
      for (float lp : g.logprobs) EXPECT_TRUE(std::isfinite(lp) && lp <= 0.0f) << dtype;
    }
    // Its image is F32 again, and an fp32 policy reads it.
    const std::string written = (*policy)->SafetensorsBytes();
    auto back = ParseSafetensorsViews(written, "16-bit image");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->at("tok_emb.weight").dtype, "F32");
    auto trained = (*policy)->TrainStep(VariedBatch(2), TrainOptions{});
    EXPECT_EQ(trained.status().code(), absl::StatusCode::kFailedPrecondition) << trained.status();
  }
  PolicyConfig bad = Small();
  bad.dtype = "fp8";
  EXPECT_TRUE(absl::StrContains(Policy::Create(bad, TestDevice()).status().message(), "want fp32, bf16 or fp16"));
}

TEST(Policy, SafetensorsRoundTripRestoresTheSameModel) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/policy.safetensors";
  auto a = Policy::Create(Small(), TestDevice(), 1);
  auto b = Policy::Create(Small(), TestDevice(), 2);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<std::vector<int32_t>> tokens = {{1, 4, 9, 10, 3}};
  ASSERT_GT(MaxAbsDiff(*(*a)->Logits(tokens), *(*b)->Logits(tokens)), 1e-3f);
  ASSERT_TRUE((*a)->SaveSafetensors(path).ok());
  ASSERT_TRUE((*b)->LoadSafetensors(path).ok());
  EXPECT_EQ(MaxAbsDiff(*(*a)->Logits(tokens), *(*b)->Logits(tokens)), 0.0f);
  auto blobs = ReadSafetensors(path);
  ASSERT_TRUE(blobs.ok());
  EXPECT_EQ(blobs->at("tok_emb.weight").shape, (std::vector<int64_t>{32, 32}));
  // The image holds the parameters in their own order, back to back (their one buffer,
  // copied once), and what it holds loads into another policy as the file did.
  const std::string image = (*a)->SafetensorsBytes();
  auto views = ParseSafetensorsViews(image, "image");
  ASSERT_TRUE(views.ok()) << views.status();
  const char* next = nullptr;
  for (const std::string& name : (*a)->ParameterNames()) {
    ASSERT_TRUE(views->count(name)) << name;
    if (next != nullptr) EXPECT_EQ(views->at(name).bytes.data(), next) << name;
    next = views->at(name).bytes.data() + views->at(name).bytes.size();
  }
  EXPECT_EQ(next, image.data() + image.size());
  auto d = Policy::Create(Small(), TestDevice(), 3);
  ASSERT_TRUE((*d)->LoadSafetensorsBytes(image, "image").ok());
  EXPECT_EQ(MaxAbsDiff(*(*a)->Logits(tokens), *(*d)->Logits(tokens)), 0.0f);
  // A model of another shape refuses the file, naming the tensor.
  PolicyConfig other = Small();
  other.d_model = 64;
  auto c = Policy::Create(other, TestDevice());
  absl::Status s = (*c)->LoadSafetensors(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "tensor `")) << s;
  EXPECT_EQ((*c)->LoadSafetensors("/nonexistent.safetensors").code(), absl::StatusCode::kNotFound);
}

// GRPO on a one-token task: the reward is 1 when the response is the token for '6'.
// The probability of that token must rise from chance (~1/32) to most of the mass.
TEST(PolicyTraining, OptimizerStateRoundTripContinuesTrainingExactly) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  auto a = Policy::Create(Small(), TestDevice(), 1);
  auto b = Policy::Create(Small(), TestDevice(), 2);
  auto c = Policy::Create(Small(), TestDevice(), 3);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::vector<TrainSequence> batch(4);
  for (int i = 0; i < 4; ++i) {
    batch[i].prompt = {1, 4, 5 + i};
    batch[i].response = {6, 7 + i, 2};
    batch[i].behaviour_logprobs = {-3, -3, -3};
    batch[i].advantage = i % 2 ? 1.0f : -1.0f;
  }
  TrainOptions options;
  options.weight_decay = 0.01f;
  bool saved = false;
  ASSERT_TRUE((*a)->SaveOptimizerState(dir + "/none.safetensors", &saved).ok());
  EXPECT_FALSE(saved) << "a policy that never trained has no optimizer state";
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*a)->TrainStep(batch, options).ok());
  ASSERT_TRUE((*a)->SaveSafetensors(dir + "/w.safetensors").ok());
  ASSERT_TRUE((*a)->SaveOptimizerState(dir + "/o.safetensors", &saved).ok());
  EXPECT_TRUE(saved);
  ASSERT_TRUE((*b)->LoadSafetensors(dir + "/w.safetensors").ok());
  ASSERT_TRUE((*b)->LoadOptimizerState(dir + "/o.safetensors").ok());
  ASSERT_TRUE((*c)->LoadSafetensors(dir + "/w.safetensors").ok());  // weights only
  for (auto* p : {a->get(), b->get(), c->get()}) ASSERT_TRUE(p->TrainStep(batch, options).ok());
  const std::vector<std::vector<int32_t>> probe = {{1, 4, 5, 6, 7}};
  const auto la = *(*a)->Logits(probe), lb = *(*b)->Logits(probe), lc = *(*c)->Logits(probe);
  EXPECT_LT(MaxAbsDiff(la, lb), 1e-6f);
  EXPECT_GT(MaxAbsDiff(la, lc), 1e-4f) << "without the optimizer state the step should differ";
  // A file for another model changes nothing and names the tensor.
  PolicyConfig wider = TinyConfig();
  wider.d_model = 64;
  auto other = Policy::Create(wider, TestDevice());
  ASSERT_TRUE((*other)->TrainStep(batch, options).ok());
  ASSERT_TRUE((*other)->SaveOptimizerState(dir + "/other.safetensors", &saved).ok());
  absl::Status s = (*b)->LoadOptimizerState(dir + "/other.safetensors");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "wrong shape")) << s;
}

TEST(PolicyTraining, PpoWithGaeLearnsTheCriticAndRaisesRewardedTokens) {
  PolicyConfig c = Small();
  auto plain = Policy::Create(c, TestDevice(), 5);
  c.value_head = true;
  auto policy = Policy::Create(c, TestDevice(), 5);
  ASSERT_TRUE(policy.ok() && plain.ok());
  const std::vector<int32_t> prompt = *Tokenizer::EncodePrompt("sort:6");
  const int32_t target = Tokenizer::EncodeResponse("6")->at(0);
  auto probability = [&]() { return TokenProbability(**policy, prompt, target); };
  const float before = probability();
  SamplingOptions sampling;
  sampling.max_new_tokens = 2;
  TrainOptions train;
  train.learning_rate = 3e-3f;
  train.gae = true;
  float first_value_loss = -1, last_value_loss = -1;
  for (int step = 0; step < 40; ++step) {
    sampling.seed = step;
    auto gens = (*policy)->Generate(std::vector<std::vector<int32_t>>(16, prompt), sampling);
    ASSERT_TRUE(gens.ok());
    std::vector<TrainSequence> batch;
    for (const Generation& g : *gens) {
      TrainSequence s;
      s.prompt = prompt;
      s.response = g.tokens;
      s.behaviour_logprobs = g.logprobs;
      s.reward = g.tokens[0] == target ? 1.0f : 0.0f;  // no advantage given: GAE makes them
      batch.push_back(std::move(s));
    }
    if (step == 0) {
      EXPECT_EQ((*plain)->TrainStep(batch, train).status().code(), absl::StatusCode::kFailedPrecondition);
    }
    auto stats = (*policy)->TrainStep(batch, train);
    ASSERT_TRUE(stats.ok()) << stats.status();
    if (step == 0) first_value_loss = stats->value_loss;
    last_value_loss = stats->value_loss;
  }
  EXPECT_LT(before, 0.15f);
  EXPECT_GT(probability(), 0.5f) << "before " << before;
  EXPECT_GT(first_value_loss, 0.0f);
  EXPECT_LT(last_value_loss, first_value_loss) << "the critic did not get closer to the returns";
}

// --precision=bf16: the forward pass under autocast. From the same start a step moves
// the weights nearly as fp32 does, not exactly (so autocast ran); the weights stay fp32;
// and GRPO still learns.
TEST(PolicyTraining, Bf16AutocastTrainsFp32WeightsAndStillLearns) {
  PolicyConfig autocast = Small();
  autocast.bf16_autocast = true;
  auto plain = Policy::Create(Small(), TestDevice(), 5);
  auto mixed = Policy::Create(autocast, TestDevice(), 5);
  ASSERT_TRUE(plain.ok() && mixed.ok()) << mixed.status();
  const std::vector<TrainSequence> batch = VariedBatch(8);
  TrainOptions train;
  train.learning_rate = 3e-3f;
  ASSERT_TRUE((*plain)->TrainStep(batch, train).ok());
  auto stepped = (*mixed)->TrainStep(batch, train);
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  EXPECT_TRUE(std::isfinite(stepped->loss) && std::isfinite(stepped->grad_norm));
  const std::vector<std::vector<int32_t>> tokens = {{1, 4, 9, 10, 3}};
  const float diff = MaxAbsDiff(*(*plain)->Logits(tokens), *(*mixed)->Logits(tokens));
  EXPECT_GT(diff, 0.0f) << "the bf16 step equals the fp32 one: autocast did not run";
  EXPECT_LT(diff, 0.05f);
  const std::string image = (*mixed)->SafetensorsBytes();
  auto views = ParseSafetensorsViews(image, "autocast policy");
  ASSERT_TRUE(views.ok());
  EXPECT_EQ(views->at("lm_head.weight").dtype, "F32");
  // GRPO on the one-token task still raises the rewarded token.
  const std::vector<int32_t> prompt = *Tokenizer::EncodePrompt("sort:6");
  const int32_t target = Tokenizer::EncodeResponse("6")->at(0);
  const float before = TokenProbability(**mixed, prompt, target);
  SamplingOptions sampling;
  sampling.max_new_tokens = 1;
  for (int step = 0; step < 40; ++step) {
    sampling.seed = step;
    auto gens = (*mixed)->Generate(std::vector<std::vector<int32_t>>(16, prompt), sampling);
    ASSERT_TRUE(gens.ok());
    float mean = 0;
    for (const Generation& g : *gens) mean += (g.tokens[0] == target ? 1.0f : 0.0f) / gens->size();
    std::vector<TrainSequence> grpo;
    for (const Generation& g : *gens) grpo.push_back({prompt, g.tokens, g.logprobs, (g.tokens[0] == target) - mean});
    ASSERT_TRUE((*mixed)->TrainStep(grpo, train).ok());
  }
  EXPECT_GT(TokenProbability(**mixed, prompt, target), 0.5f) << "before " << before;
  PolicyConfig bad = autocast;
  bad.dtype = "bf16";
  EXPECT_EQ(Policy::Create(bad, TestDevice()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PolicyTraining, MaskedResponseTokensAreLeftOutOfTheLoss) {
  // A multi-turn trajectory: tokens 2..3 are a tool's output. Whatever their behaviour
  // log-probabilities say, the update is the same; unmasked, it is not.
  auto make = [](float tool_logprob, bool masked) {
    std::vector<TrainSequence> batch(2);
    for (int i = 0; i < 2; ++i) {
      batch[i].prompt = {1, 4, 5 + i};
      batch[i].response = {6, 7 + i, 12, 13, 9, 2};
      batch[i].behaviour_logprobs = {-3, -3, tool_logprob, tool_logprob, -3, -3};
      batch[i].advantage = i == 0 ? 1.0f : -1.0f;
      if (masked) batch[i].loss_mask = {1, 1, 0, 0, 1, 1};
    }
    return batch;
  };
  const std::vector<std::vector<int32_t>> probe = {{1, 4, 5, 6, 7, 12, 13, 9}};
  auto logits_after = [&](const std::vector<TrainSequence>& batch, TrainStats* stats) {
    auto policy = Policy::Create(Small(), TestDevice(), 9);
    EXPECT_TRUE(policy.ok());
    auto s = (*policy)->TrainStep(batch, TrainOptions{});
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) *stats = *s;
    return *(*policy)->Logits(probe);
  };
  TrainStats a_stats, b_stats, c_stats;
  const auto a = logits_after(make(-0.01f, true), &a_stats);
  const auto b = logits_after(make(-20.0f, true), &b_stats);
  const auto c = logits_after(make(-20.0f, false), &c_stats);
  EXPECT_LT(MaxAbsDiff(a, b), 1e-6f) << "masked tokens changed the update";
  EXPECT_GT(MaxAbsDiff(a, c), 1e-4f) << "unmasked, the same tokens should change it";
  EXPECT_EQ(a_stats.tokens, 8) << "the tokens in the loss";
  EXPECT_EQ(c_stats.tokens, 12);
  // A mask of the wrong length, one that leaves nothing, and one with GAE are errors.
  auto policy = Policy::Create(Small(), TestDevice(), 9);
  std::vector<TrainSequence> bad = make(-1, true);
  bad[0].loss_mask.pop_back();
  EXPECT_EQ((*policy)->TrainStep(bad, TrainOptions{}).status().code(), absl::StatusCode::kInvalidArgument);
  bad = make(-1, true);
  bad[1].loss_mask.assign(6, 0);
  EXPECT_TRUE(absl::StrContains((*policy)->TrainStep(bad, TrainOptions{}).status().message(), "no token in the loss"));
}

TEST(PolicyTraining, GrpoStepsRaiseTheProbabilityOfRewardedTokens) {
  auto policy = Policy::Create(Small(), TestDevice(), 5);
  ASSERT_TRUE(policy.ok());
  const std::vector<int32_t> prompt = *Tokenizer::EncodePrompt("sort:6");
  const int32_t target = Tokenizer::EncodeResponse("6")->at(0);
  auto probability = [&]() { return TokenProbability(**policy, prompt, target); };
  const float before = probability();
  SamplingOptions sampling;
  sampling.max_new_tokens = 1;
  TrainOptions train;
  train.learning_rate = 3e-3f;
  TrainStats stats;
  for (int step = 0; step < 40; ++step) {
    sampling.seed = step;
    auto gens = (*policy)->Generate(std::vector<std::vector<int32_t>>(16, prompt), sampling);
    ASSERT_TRUE(gens.ok());
    std::vector<float> rewards;
    for (const Generation& g : *gens) rewards.push_back(g.tokens[0] == target ? 1.0f : 0.0f);
    float mean = 0, var = 0;
    for (float r : rewards) mean += r / rewards.size();
    for (float r : rewards) var += (r - mean) * (r - mean) / rewards.size();
    std::vector<TrainSequence> batch;
    for (size_t i = 0; i < gens->size(); ++i) {
      const float adv = var > 0 ? (rewards[i] - mean) / (std::sqrt(var) + 1e-6f) : 0.0f;
      batch.push_back({prompt, (*gens)[i].tokens, (*gens)[i].logprobs, adv});
    }
    auto s = (*policy)->TrainStep(batch, train);
    ASSERT_TRUE(s.ok()) << s.status();
    stats = *s;
  }
  const float after = probability();
  EXPECT_LT(before, 0.15f);
  EXPECT_GT(after, 0.5f) << "before " << before;
  EXPECT_EQ(stats.tokens, 16);
  EXPECT_TRUE(std::isfinite(stats.grad_norm));
  // Bad batches are clear errors.
  EXPECT_EQ((*policy)->TrainStep({}, train).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*policy)->TrainStep({{prompt, {target}, {}, 1.0f}}, train).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rlfleet::model

// Continuous batching: sequences that join a running batch, leave it, or see a weight
// swap generate exactly what the same algorithm gives them alone.
#include <cstdlib>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/model/policy.h"
#include "libs/model/test_util.h"

namespace rlfleet::model {
namespace {

PolicyConfig Small(const std::string& arch) { return WithArch(TinyConfig(/*max_seq_len=*/40), arch); }

// Every test runs on the built-in model and on the Llama family.
class DecodeBatchArch : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Arch, DecodeBatchArch, ::testing::Values("gpt", "llama"));

std::vector<int32_t> RandomPrompt(std::mt19937& rng, int length) {
  std::vector<int32_t> p(length);
  for (int32_t& t : p) t = 3 + rng() % 29;  // real tokens, never PAD (0)
  return p;
}

DecodeBatch::Sequence Seq(uint64_t id, std::vector<int32_t> prompt, int max_new, float temperature, uint64_t seed) {
  DecodeBatch::Sequence s;
  s.id = id;
  s.prompt = std::move(prompt);
  s.options.max_new_tokens = max_new;
  s.options.temperature = temperature;
  s.options.eos_id = -1;  // run to max_new_tokens: longer overlaps
  s.options.seed = seed;
  return s;
}

// What `s` generates alone in a fresh batch.
std::vector<int32_t> Alone(Policy* policy, const DecodeBatch::Sequence& s) {
  DecodeBatch batch(policy, 1);
  std::vector<int32_t> out;
  auto first = batch.Add({s});
  EXPECT_TRUE(first.ok()) << first.status();
  for (const auto& t : *first) out.push_back(t.token);
  while (batch.size() > 0) {
    auto step = batch.Step();
    EXPECT_TRUE(step.ok()) << step.status();
    for (const auto& t : *step) out.push_back(t.token);
  }
  return out;
}

TEST_P(DecodeBatchArch, SequencesJoiningAndLeavingAtRandomGenerateWhatTheyGenerateAlone) {
  auto policy = Policy::Create(Small(GetParam()), TestDevice(), 11);
  ASSERT_TRUE(policy.ok());
  for (float temperature : {0.0f, 1.0f}) {
    std::mt19937 rng(temperature == 0 ? 1 : 2);
    DecodeBatch batch(policy->get(), 6);
    std::map<uint64_t, DecodeBatch::Sequence> all;
    std::map<uint64_t, std::vector<int32_t>> got;
    uint64_t next_id = 0;
    int refused = 0;
    for (int step = 0; step < 120 || batch.size() > 0; ++step) {
      // Now and then a group of 1-3 sequences with random prompt lengths tries to join
      // (longer and shorter than what is running: the cache moves both ways).
      if (step < 120 && rng() % 3 == 0) {
        std::vector<DecodeBatch::Sequence> group;
        const int n = 1 + rng() % 3;
        for (int j = 0; j < n; ++j) {
          group.push_back(Seq(next_id + j, RandomPrompt(rng, 1 + rng() % 14), 1 + rng() % 20, temperature, rng()));
        }
        if (batch.CanAdd(group)) {
          for (const auto& s : group) all[s.id] = s;
          next_id += n;
          auto first = batch.Add(group);
          ASSERT_TRUE(first.ok()) << first.status();
          for (const auto& t : *first) got[t.id].push_back(t.token);
        } else {
          ++refused;
          EXPECT_EQ(batch.Add(group).status().code(), absl::StatusCode::kFailedPrecondition);
        }
      }
      EXPECT_LE(batch.size(), 6);
      auto tokens = batch.Step();
      ASSERT_TRUE(tokens.ok()) << tokens.status();
      for (const auto& t : *tokens) got[t.id].push_back(t.token);
    }
    ASSERT_GT(all.size(), 20u);
    EXPECT_GT(refused, 0) << "the schedule never filled the batch";
    for (const auto& [id, s] : all) {
      EXPECT_EQ(got[id], Alone(policy->get(), s)) << "sequence " << id << ", temperature " << temperature;
      EXPECT_EQ(got[id].size(), static_cast<size_t>(s.options.max_new_tokens));
    }
  }
}

TEST_P(DecodeBatchArch, AfterAWeightSwapAndRefreshTokensComeFromTheNewWeightsAlone) {
  auto policy = Policy::Create(Small(GetParam()), TestDevice(), 1);
  auto other = Policy::Create(Small(GetParam()), TestDevice(), 2);
  ASSERT_TRUE(policy.ok() && other.ok());
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/other.safetensors");
  ASSERT_TRUE((*other)->SaveSafetensors(path).ok());
  std::mt19937 rng(5);
  std::vector<int32_t> prompt_a = RandomPrompt(rng, 5), prompt_b = RandomPrompt(rng, 9);
  DecodeBatch batch(policy->get(), 4);
  std::map<uint64_t, std::vector<int32_t>> got;
  auto first = batch.Add({Seq(0, prompt_a, 16, 0, 0), Seq(1, prompt_b, 16, 0, 0)});
  ASSERT_TRUE(first.ok());
  for (const auto& t : *first) got[t.id].push_back(t.token);
  auto step = [&] {
    auto tokens = batch.Step();  // (not `for (t : *batch.Step())`: a dangling temporary)
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    for (const auto& t : *tokens) got[t.id].push_back(t.token);
  };
  for (int i = 0; i < 4; ++i) step();
  ASSERT_TRUE((*policy)->LoadSafetensors(path).ok());
  ASSERT_TRUE(batch.Refresh().ok());
  std::map<uint64_t, size_t> swapped_at = {{0, got[0].size()}, {1, got[1].size()}};
  while (batch.size() > 0) step();
  // The new weights, given prompt + the tokens decoded before the swap, continue
  // exactly as the batch did.
  for (auto [id, prompt] : std::map<uint64_t, std::vector<int32_t>>{{0, prompt_a}, {1, prompt_b}}) {
    std::vector<int32_t> prefix = prompt;
    prefix.insert(prefix.end(), got[id].begin(), got[id].begin() + swapped_at[id]);
    // The last pre-swap token has not been fed yet: it is the prefix's last token.
    auto rest = Alone(other->get(), Seq(id, prefix, 16 - swapped_at[id], 0, 0));
    std::vector<int32_t> want(got[id].begin() + swapped_at[id], got[id].end());
    EXPECT_EQ(rest, want) << "sequence " << id;
  }
}

TEST_P(DecodeBatchArch, FullBatchRefusesAndRemoveFreesARow) {
  auto policy = Policy::Create(Small(GetParam()), TestDevice(), 3);
  ASSERT_TRUE(policy.ok());
  DecodeBatch batch(policy->get(), 2);
  ASSERT_TRUE(batch.Add({Seq(7, {4, 5, 6}, 10, 0, 0), Seq(8, {4, 5}, 10, 0, 0)}).ok());
  EXPECT_EQ(batch.size(), 2);
  EXPECT_FALSE(batch.CanAdd({Seq(9, {4}, 5, 0, 0)}));
  EXPECT_EQ(batch.Add({Seq(9, {4}, 5, 0, 0)}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(batch.Remove(7));
  EXPECT_FALSE(batch.Remove(7));
  EXPECT_EQ(batch.size(), 1);
  ASSERT_TRUE(batch.Add({Seq(9, {4}, 5, 0, 0)}).ok());
  // Bad input is INVALID_ARGUMENT, and nothing joins.
  EXPECT_EQ(batch.Add({Seq(10, {}, 5, 0, 0)}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch.Add({Seq(10, {4, 99}, 5, 0, 0)}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch.Add({Seq(10, {4}, 40, 0, 0)}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch.size(), 2);
}

// On a CUDA device the step replays a CUDA graph per batch-size bucket; it must decode
// what the eager step decodes: the same tokens (greedy and sampled), log-probs within
// float noise, through joins that move the cache, a removal, a weight swap (the graph
// reads the weights in place) and a second DecodeBatch that reuses the first's graphs.
TEST_P(DecodeBatchArch, CudaGraphStepsDecodeWhatEagerStepsDecode) {
  PolicyConfig graphed = Small(GetParam()), eager = Small(GetParam());
  graphed.cuda_graphs = true;
  eager.cuda_graphs = false;
  auto a = Policy::Create(graphed, TestDevice(), 21);
  auto b = Policy::Create(eager, TestDevice(), 21);
  auto other = Policy::Create(Small(GetParam()), TestDevice(), 22);
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  const bool cuda = TestDevice().rfind("cuda", 0) == 0;
  EXPECT_EQ((*a)->DecodeMode(), cuda ? "cuda graphs" : "eager");
  EXPECT_EQ((*b)->DecodeMode(), "eager");
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/graphs_other.safetensors");
  ASSERT_TRUE((*other)->SaveSafetensors(path).ok());
  struct Got {
    std::map<uint64_t, std::vector<int32_t>> tokens;
    std::map<uint64_t, std::vector<float>> logprobs;
  };
  auto scenario = [&](Policy* policy, bool swap) {
    Got got;
    auto keep = [&](const absl::StatusOr<std::vector<DecodeBatch::Token>>& tokens) {
      ASSERT_TRUE(tokens.ok()) << tokens.status();
      for (const auto& t : *tokens) {
        got.tokens[t.id].push_back(t.token);
        got.logprobs[t.id].push_back(t.logprob);
      }
    };
    std::mt19937 rng(9);
    DecodeBatch batch(policy, 6);
    keep(batch.Add({Seq(0, RandomPrompt(rng, 4), 14, 0, 0), Seq(1, RandomPrompt(rng, 7), 9, 1.0f, 5),
                    Seq(2, RandomPrompt(rng, 3), 12, 1.0f, 6)}));
    for (int i = 0; i < 3; ++i) keep(batch.Step());
    keep(batch.Add({Seq(3, RandomPrompt(rng, 11), 8, 0, 0), Seq(4, RandomPrompt(rng, 2), 10, 1.0f, 7)}));
    keep(batch.Step());
    EXPECT_TRUE(batch.Remove(2));
    keep(batch.Step());
    if (swap) {
      EXPECT_TRUE(policy->LoadSafetensors(path).ok());
      EXPECT_TRUE(batch.Refresh().ok());
    }
    while (batch.size() > 0) keep(batch.Step());
    return got;
  };
  for (bool swap : {false, true}) {  // (the second round: new DecodeBatches on the same policies)
    const Got g = scenario(a->get(), swap), e = scenario(b->get(), swap);
    ASSERT_EQ(g.tokens.size(), 5u);
    EXPECT_EQ(g.tokens, e.tokens) << "swap " << swap;
    for (const auto& [id, lp] : g.logprobs) {
      EXPECT_LT(MaxAbsDiff(lp, e.logprobs.at(id)), 1e-4f) << "sequence " << id << ", swap " << swap;
    }
  }
}

// What RL needs of the rollout: every token's log-prob as sampled is the one the
// trainer computes for it (Policy::ResponseLogProbs: TrainStep's forward pass over the
// whole sequence). Many sequences join at different positions and leave at different
// times (the cache moves), several heads, buckets that change, a weight swap midway
// (Refresh), and sampled PAD ids (vocabulary 32: some responses hold token 0, which
// the trainer must count as a real token).
TEST_P(DecodeBatchArch, SampledLogProbsAreTheTrainersLogProbs) {
  PolicyConfig config = WithArch(TinyConfig(/*max_seq_len=*/40), GetParam());
  config.d_model = 64;
  config.n_heads = 8;
  config.cuda_graphs = true;  // (on CUDA: what the graphs sample is checked too)
  auto policy = Policy::Create(config, TestDevice(), 31);
  auto original = Policy::Create(config, TestDevice(), 31);  // (scores the tokens before the swap)
  auto other = Policy::Create(config, TestDevice(), 32);
  ASSERT_TRUE(policy.ok() && original.ok() && other.ok());
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/lp_other.safetensors");
  ASSERT_TRUE((*other)->SaveSafetensors(path).ok());
  std::mt19937 rng(4);
  DecodeBatch batch(policy->get(), 24);
  std::map<uint64_t, TrainSequence> before, after;  // by id: what each version decoded
  std::map<uint64_t, std::vector<int32_t>> prompt;
  bool swapped = false;
  auto keep = [&](const absl::StatusOr<std::vector<DecodeBatch::Token>>& tokens) {
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    for (const auto& t : *tokens) {
      TrainSequence& s = (swapped ? after : before)[t.id];
      s.response.push_back(t.token);
      s.behaviour_logprobs.push_back(t.logprob);
    }
  };
  uint64_t next = 0;
  for (int step = 0; step < 60 || batch.size() > 0; ++step) {
    if (step < 60 && step % 3 == 0) {
      std::vector<DecodeBatch::Sequence> joining;
      const int k = 1 + static_cast<int>(rng() % 5);
      for (int j = 0; j < k; ++j) {
        const uint64_t id = next++;
        const int length = 2 + static_cast<int>(rng() % 12), max_new = 4 + static_cast<int>(rng() % 14);
        prompt[id] = RandomPrompt(rng, length);
        joining.push_back(Seq(id, prompt[id], max_new, 1.0f, id));
      }
      if (batch.CanAdd(joining)) keep(batch.Add(joining));
    }
    if (step == 30) {  // the weights swap: later tokens come from `other`
      ASSERT_TRUE((*policy)->LoadSafetensors(path).ok());
      ASSERT_TRUE(batch.Refresh().ok());
      swapped = true;
    }
    if (batch.size() > 0) keep(batch.Step());
  }
  ASSERT_GT(before.size(), 20u);
  ASSERT_GT(after.size(), 10u);
  int pad_tokens = 0;
  float worst = 0;
  for (bool late : {false, true}) {
    // A sequence's tokens after the swap are scored by `other` on the whole sequence
    // (its tokens before the swap become part of its prompt).
    std::vector<TrainSequence> scored;
    for (const auto& [id, s] : late ? after : before) {
      TrainSequence t = s;
      t.prompt = prompt[id];
      if (late && before.count(id)) {
        t.prompt.insert(t.prompt.end(), before[id].response.begin(), before[id].response.end());
      }
      for (int32_t token : t.response) pad_tokens += token == 0;
      scored.push_back(std::move(t));
    }
    auto lp = (late ? *other : *original)->ResponseLogProbs(scored);
    ASSERT_TRUE(lp.ok()) << lp.status();
    for (size_t i = 0; i < scored.size(); ++i) {
      const float d = MaxAbsDiff((*lp)[i], scored[i].behaviour_logprobs);
      worst = std::max(worst, d);
    }
  }
  EXPECT_GT(pad_tokens, 0) << "no PAD id was sampled: the case this test also covers did not happen";
  EXPECT_LT(worst, 1e-3f) << "sampled log-probs differ from the trainer's (" << (*policy)->DecodeMode() << ")";
  std::cout << "max |sampled - trainer's| log-prob: " << worst << " over sequences with " << pad_tokens
            << " sampled PAD ids\n";
}

}  // namespace
}  // namespace rlfleet::model

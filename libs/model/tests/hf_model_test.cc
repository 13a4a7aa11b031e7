// Hugging Face model directories: tiny random Llama / Qwen2 / Qwen3 models that
// transformers 5.17 saved, with the logits and greedy tokens it computed for them
// (libs/model/reference/make_hf_fixtures.py), loaded and run by our policy; both
// config.json spellings; checkpoints written back; bad directories refused by name.
#include "libs/model/hf_model.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/model/safetensors.h"
#include "libs/model/test_util.h"
#include "tests/util/subprocess.h"

namespace rlfleet::model {
namespace {

namespace fs = std::filesystem;

std::string FixtureDir(const std::string& arch) {
  return rlfleet::testing::RunfilePath("libs/model/testdata/hf/" + arch);
}

// A copy of a fixture directory (to break), without the files named in `leave_out`.
std::string CopyOf(const std::string& arch, const std::string& name, const std::vector<std::string>& leave_out = {}) {
  const std::string dir = FreshTestDir(name);
  for (const auto& entry : fs::directory_iterator(FixtureDir(arch))) {
    const std::string file = entry.path().filename().string();
    if (std::find(leave_out.begin(), leave_out.end(), file) != leave_out.end()) continue;
    fs::copy_file(entry.path(), fs::path(dir) / file);
  }
  return dir;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

using Expected = HfFixtureExpected;

Expected ReadExpected(const std::string& arch) {
  auto e = ReadHfFixtureExpected(FixtureDir(arch));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *e : Expected();
}

// A reward model made from a fixture as transformers' <Arch>ForSequenceClassification
// saves one: no LM head, a `score` head of one row, one label. The row is the LM head's
// row for token `k`, so the reward of a sequence is transformers' logit of `k` at its
// last token.
std::string RewardModelDir(const std::string& arch, int k) {
  HfLoadOptions options;
  auto policy = LoadHfModel(FixtureDir(arch), options);
  EXPECT_TRUE(policy.ok()) << policy.status();
  const std::string dir = FreshTestDir("rm_" + arch);
  EXPECT_TRUE((*policy)->SaveSafetensors(dir + "/all.safetensors").ok());
  auto tensors = ReadSafetensors(dir + "/all.safetensors");
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  fs::remove(dir + "/all.safetensors");
  const std::string head = tensors->count("lm_head.weight") ? "lm_head.weight" : "model.embed_tokens.weight";
  const TensorBlob& rows = tensors->at(head);
  const int64_t d = rows.shape[1];
  TensorBlob score{"F32", {1, d}, rows.bytes.substr(k * d * sizeof(float), d * sizeof(float))};
  tensors->erase("lm_head.weight");
  (*tensors)["score.weight"] = score;
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", *tensors).ok());
  nlohmann::json config = nlohmann::json::parse(Read(FixtureDir(arch) + "/config.json"));
  std::string name = config["architectures"][0];
  config["architectures"][0] = name.replace(name.find("ForCausalLM"), 11, "ForSequenceClassification");
  config["id2label"] = {{"0", "LABEL_0"}};
  Write(dir + "/config.json", config.dump(2));
  return dir;
}

class HfModel : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Arch, HfModel, ::testing::Values("llama", "qwen2", "qwen3"));

TEST_P(HfModel, ASequenceClassifierLoadsAsARewardModel) {
  const std::string arch = GetParam();
  const int k = 7;
  HfLoadOptions options;
  options.device = TestDevice();
  auto rm = LoadHfRewardModel(RewardModelDir(arch, k), options);
  ASSERT_TRUE(rm.ok()) << rm.status();
  EXPECT_TRUE((*rm)->config().value_head);
  const Expected e = ReadExpected(arch);
  auto values = (*rm)->Values(e.input_ids);
  ASSERT_TRUE(values.ok()) << values.status();
  ASSERT_EQ(values->size(), 2u);
  const int64_t vocab = (*rm)->config().vocab_size, n = static_cast<int64_t>(e.input_ids[0].size());
  for (int b = 0; b < 2; ++b) {
    EXPECT_NEAR((*values)[b], e.logits[(b * n + n - 1) * vocab + k], 1e-4) << "sequence " << b;
  }
  // A causal LM is not a reward model; a classifier of two labels neither.
  auto causal = LoadHfRewardModel(FixtureDir(arch), options);
  EXPECT_TRUE(absl::StrContains(causal.status().message(), "ForSequenceClassification")) << causal.status();
  const std::string two = RewardModelDir(arch, k);
  nlohmann::json config = nlohmann::json::parse(Read(two + "/config.json"));
  config["id2label"] = {{"0", "A"}, {"1", "B"}};
  Write(two + "/config.json", config.dump());
  auto labels = LoadHfRewardModel(two, options);
  EXPECT_TRUE(absl::StrContains(labels.status().message(), "2 labels")) << labels.status();
}

// PPO's critic on a pretrained directory: the value head starts at zero, the rest is the
// directory's; a checkpoint with the head written and read back keeps it; a policy
// without a head reads that checkpoint too (the head dropped).
TEST_P(HfModel, AValueHeadStartsAtZeroAndRoundTrips) {
  const std::string arch = GetParam();
  auto config = ReadHfConfig(FixtureDir(arch));
  ASSERT_TRUE(config.ok()) << config.status();
  config->value_head = true;
  auto critic = Policy::Create(*config, TestDevice());
  ASSERT_TRUE(critic.ok()) << critic.status();
  ASSERT_TRUE(LoadHfWeights(FixtureDir(arch), critic->get()).ok());
  const Expected e = ReadExpected(arch);
  auto values = (*critic)->Values(e.input_ids);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, std::vector<float>({0.0f, 0.0f}));
  auto logits = (*critic)->Logits(e.input_ids);
  ASSERT_TRUE(logits.ok());
  EXPECT_LT(MaxAbsDiff(*logits, e.logits), 1e-4f);

  // A head that is not zero (the LM head's row 3), written as a checkpoint and read back.
  auto image = ParseSafetensors((*critic)->SafetensorsBytes(), "critic");
  ASSERT_TRUE(image.ok()) << image.status();
  const std::string head = image->count("lm_head.weight") ? "lm_head.weight" : "model.embed_tokens.weight";
  const int64_t d = config->d_model;
  image->at("value_head.weight").bytes = image->at(head).bytes.substr(3 * d * sizeof(float), d * sizeof(float));
  std::map<std::string, TensorView> views;
  for (const auto& [name, blob] : *image) views[name] = TensorView{blob.dtype, blob.shape, blob.bytes};
  ASSERT_TRUE((*critic)->LoadTensors(views, "critic").ok());
  auto trained = (*critic)->Values(e.input_ids);
  ASSERT_TRUE(trained.ok());
  EXPECT_NE((*trained)[0], 0.0f);
  const std::string dir = FreshTestDir("critic_" + arch);
  ASSERT_TRUE(WriteHfModelDir(**critic, dir).ok());
  auto again = Policy::Create(*config, TestDevice());
  ASSERT_TRUE(LoadHfWeights(dir, again->get()).ok());
  EXPECT_EQ(*(*again)->Values(e.input_ids), *trained);
  HfLoadOptions options;
  options.device = TestDevice();
  auto actor = LoadHfModel(dir, options);
  ASSERT_TRUE(actor.ok()) << actor.status();
  EXPECT_FALSE((*actor)->config().value_head);
  EXPECT_LT(MaxAbsDiff(*(*actor)->Logits(e.input_ids), e.logits), 1e-4f);
}

TEST_P(HfModel, LogitsAndGreedyTokensAreTransformers) {
  const std::string arch = GetParam();
  HfLoadOptions options;
  options.device = TestDevice();
  auto policy = LoadHfModel(FixtureDir(arch), options);
  ASSERT_TRUE(policy.ok()) << policy.status();
  const PolicyConfig& c = (*policy)->config();
  EXPECT_EQ(c.arch, arch);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, arch == "qwen3" ? 24 : 16);
  EXPECT_EQ(c.tie_embeddings, arch == "qwen2");
  EXPECT_EQ(c.qkv_bias, arch == "qwen2");
  EXPECT_EQ(c.qk_norm, arch == "qwen3");
  EXPECT_EQ(c.rope_factor, arch == "llama" ? 8.0 : 0.0);
  EXPECT_EQ(c.max_seq_len, 256);

  const Expected e = ReadExpected(arch);
  auto logits = (*policy)->Logits(e.input_ids);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_LT(MaxAbsDiff(*logits, e.logits), 1e-4f);
  auto incremental = (*policy)->IncrementalLogits(e.input_ids);  // (through the KV cache)
  ASSERT_TRUE(incremental.ok()) << incremental.status();
  EXPECT_LT(MaxAbsDiff(*incremental, e.logits), 1e-4f);

  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 16;
  greedy.eos_id = -1;
  auto generated = (*policy)->Generate(e.input_ids, greedy);
  ASSERT_TRUE(generated.ok()) << generated.status();
  for (size_t b = 0; b < e.input_ids.size(); ++b) {
    std::vector<int32_t> want(e.greedy[b].begin() + e.input_ids[b].size(), e.greedy[b].end());
    EXPECT_EQ((*generated)[b].tokens, want) << arch << " row " << b;
  }
  // Continuous batching, the second prompt shorter (left-padded beside the first).
  DecodeBatch batch(policy->get(), 2);
  std::vector<DecodeBatch::Sequence> seqs(2);
  for (int b = 0; b < 2; ++b) {
    seqs[b].id = b;
    seqs[b].prompt = e.input_ids[b];
    seqs[b].options = greedy;
  }
  seqs[1].prompt.resize(7);
  std::vector<std::vector<int32_t>> got(2);
  auto first = batch.Add(seqs);
  ASSERT_TRUE(first.ok()) << first.status();
  for (const auto& t : *first) got[t.id].push_back(t.token);
  while (batch.size() > 0) {
    auto step = batch.Step();
    ASSERT_TRUE(step.ok()) << step.status();
    for (const auto& t : *step) got[t.id].push_back(t.token);
  }
  EXPECT_EQ(got[0], std::vector<int32_t>(e.greedy[0].begin() + 12, e.greedy[0].end()));
  auto alone = (*policy)->Generate({seqs[1].prompt}, greedy);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(got[1], (*alone)[0].tokens);
}

TEST_P(HfModel, BothConfigSpellingsReadAlike) {
  auto v5 = ReadHfConfig(FixtureDir(GetParam()));
  ASSERT_TRUE(v5.ok()) << v5.status();
  auto v4 = ParseHfConfig(Read(FixtureDir(GetParam()) + "/config.v4.json"), "config.v4.json");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(HfConfigJson(*v4), HfConfigJson(*v5));
  EXPECT_EQ(v4->rope_theta, GetParam() == "llama" ? 50000.0 : 1e6);
}

TEST_P(HfModel, AWrittenCheckpointReadsBackIdenticalAndKeepsTheLayout) {
  HfLoadOptions options;
  options.device = TestDevice();
  auto policy = LoadHfModel(FixtureDir(GetParam()), options);
  ASSERT_TRUE(policy.ok()) << policy.status();
  // Trained a little first, so that what is written is not what was read.
  std::vector<TrainSequence> batch(4);
  for (int i = 0; i < 4; ++i) {
    batch[i].prompt = {5, 6, 7, 8 + i};
    batch[i].response = {9, 10 + i, 11};
    batch[i].behaviour_logprobs = {-4.5f, -4.5f, -4.5f};
    batch[i].advantage = i % 2 ? 1.0f : -1.0f;
  }
  TrainOptions train;
  train.learning_rate = 1e-3f;
  auto stats = (*policy)->TrainStep(batch, train);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(std::isfinite(stats->loss));

  const std::string dir = FreshTestDir("written_" + GetParam());
  ASSERT_TRUE(WriteHfModelDir(**policy, dir).ok());
  auto back = LoadHfModel(dir, options);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(HfConfigJson((*back)->config()), HfConfigJson((*policy)->config()));
  EXPECT_EQ((*back)->SafetensorsBytes(), (*policy)->SafetensorsBytes());
  const std::vector<std::vector<int32_t>> tokens = {{3, 4, 5, 6, 7}};
  auto a = (*policy)->Logits(tokens), b = (*back)->Logits(tokens);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  // The tensor names are transformers' (a tied model writes no lm_head).
  auto header = ParseSafetensorsHeader(Read(dir + "/model.safetensors"), "written");
  ASSERT_TRUE(header.ok());
  EXPECT_TRUE(header->count("model.layers.1.mlp.down_proj.weight"));
  EXPECT_EQ(header->count("lm_head.weight"), GetParam() == "qwen2" ? 0u : 1u);
}

// A model read from a directory with a short KV cache, written with that directory as
// its base: the source's max_position_embeddings and token ids stay, both config
// spellings are there and agree, and the directory reads back as the same config.
TEST_P(HfModel, AWrittenConfigKeepsTheSourcesKeysInBothSpellings) {
  HfLoadOptions options;
  options.max_seq_len = 32;
  auto policy = LoadHfModel(FixtureDir(GetParam()), options);
  ASSERT_TRUE(policy.ok()) << policy.status();
  const std::string dir = FreshTestDir("based_" + GetParam());
  ASSERT_TRUE(WriteHfModelDir(**policy, dir, FixtureDir(GetParam())).ok());
  const nlohmann::json source = nlohmann::json::parse(Read(FixtureDir(GetParam()) + "/config.json"));
  const nlohmann::json written = nlohmann::json::parse(Read(dir + "/config.json"));
  EXPECT_EQ(written["max_position_embeddings"], 256) << "the KV cache's width is not the model's limit";
  EXPECT_EQ(written["bos_token_id"], source["bos_token_id"]);
  EXPECT_EQ(written["eos_token_id"], source["eos_token_id"]);
  EXPECT_EQ(written["dtype"], "float32");
  EXPECT_EQ(written["torch_dtype"], "float32");
  EXPECT_EQ(written["rope_theta"], written["rope_parameters"]["rope_theta"]);
  if (GetParam() == "llama") {
    EXPECT_EQ(written["rope_scaling"], written["rope_parameters"]);
    EXPECT_EQ(written["rope_scaling"]["rope_type"], "llama3");
  } else {
    EXPECT_TRUE(written["rope_scaling"].is_null());
  }
  // Each spelling alone says the same.
  nlohmann::json v4 = written, v5 = written;
  v4.erase("rope_parameters");
  v4.erase("dtype");
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5.erase("torch_dtype");
  auto a = ParseHfConfig(v4.dump(), "v4"), b = ParseHfConfig(v5.dump(), "v5"), c = ReadHfConfig(FixtureDir(GetParam()));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status() << b.status() << c.status();
  EXPECT_EQ(HfConfigJson(*a), HfConfigJson(*c));
  EXPECT_EQ(HfConfigJson(*b), HfConfigJson(*c));
  // Without a base: the KV cache's width, as before.
  const std::string bare = FreshTestDir("bare_" + GetParam());
  ASSERT_TRUE(WriteHfModelDir(**policy, bare).ok());
  EXPECT_EQ(nlohmann::json::parse(Read(bare + "/config.json"))["max_position_embeddings"], 32);
}

TEST(HfModelErrors, ConfigProblemsAreNamed) {
  const std::string good = Read(FixtureDir("qwen2") + "/config.json");
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    auto c = ParseHfConfig(text, "config.json");
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_TRUE(absl::StrContains(c.status().message(), needle)) << c.status();
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  expect_error(replaced("\"model_type\": \"qwen2\"", "\"model_type\": \"mistral\""), "mistral");
  expect_error(replaced("\"hidden_size\": 64,", ""), "`hidden_size` is missing");
  expect_error(replaced("\"hidden_size\": 64", "\"hidden_size\": \"64\""), "`hidden_size` must be an integer");
  expect_error(replaced("\"rope_type\": \"default\"", "\"rope_type\": \"yarn\""), "yarn");
  expect_error(replaced("\"use_sliding_window\": false", "\"use_sliding_window\": true"), "sliding-window");
  expect_error(replaced("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""), "`hidden_act`");
  expect_error(replaced("\"vocab_size\": 96", "\"vocab_size\": 96,,"), "line");
  EXPECT_EQ(ReadHfConfig(FreshTestDir("empty")).status().code(), absl::StatusCode::kNotFound);
}

TEST(HfModelErrors, WeightProblemsAreNamedAndChangeNothing) {
  auto check = [](const std::string& dir, absl::StatusCode code, const std::string& needle) {
    auto config = ReadHfConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    auto policy = Policy::Create(*config);
    ASSERT_TRUE(policy.ok());
    const std::string before = (*policy)->SafetensorsBytes();
    const absl::Status s = LoadHfWeights(dir, policy->get());
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), needle)) << s;
    EXPECT_EQ((*policy)->SafetensorsBytes(), before);
  };
  // A shard the index lists is absent.
  check(CopyOf("llama", "no_shard", {"model-00003-of-00006.safetensors"}), absl::StatusCode::kNotFound,
        "model-00003-of-00006.safetensors");
  // Neither a model.safetensors nor an index.
  check(CopyOf("qwen3", "no_weights", {"model.safetensors"}), absl::StatusCode::kNotFound, "model.safetensors");
  // A config whose MLP is wider than the weights: the tensor is named.
  {
    const std::string dir = CopyOf("qwen3", "wide");
    std::string config = Read(dir + "/config.json");
    config.replace(config.find("\"intermediate_size\": 112"), 24, "\"intermediate_size\": 128");
    Write(dir + "/config.json", config);
    check(dir, absl::StatusCode::kInvalidArgument, "mlp.gate_proj.weight");
  }
  // A tensor that is not a parameter of the model (a Qwen3 config over Qwen2 weights:
  // Qwen2's q/k/v biases).
  {
    const std::string dir = CopyOf("qwen2", "foreign");
    Write(dir + "/config.json", Read(FixtureDir("qwen3") + "/config.json"));
    std::string config = Read(dir + "/config.json");
    config.replace(config.find("\"head_dim\": 24"), 14, "\"head_dim\": 16");
    config.replace(config.find("\"tie_word_embeddings\": false"), 28, "\"tie_word_embeddings\": true");
    Write(dir + "/config.json", config);
    check(dir, absl::StatusCode::kInvalidArgument, "_proj.bias` in");
  }
  // A shard name leading out of the directory is refused.
  {
    const std::string dir = CopyOf("llama", "escape");
    std::string index = Read(dir + "/model.safetensors.index.json");
    const std::string from = "\"model-00006-of-00006.safetensors\"";
    for (size_t at; (at = index.find(from)) != std::string::npos;)
      index.replace(at, from.size(), "\"../x.safetensors\"");
    Write(dir + "/model.safetensors.index.json", index);
    check(dir, absl::StatusCode::kInvalidArgument, "outside");
  }
}

// End-of-sequence ids: generation_config.json first, then config.json, id or list.
TEST(HfModelErrors, EosIdsComeFromTheGenerationConfigThenTheConfig) {
  const std::string dir = CopyOf("llama", "eos");
  auto ids = ReadHfEosIds(dir);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, std::vector<int32_t>({2}));  // (config.json's "eos_token_id": 2)
  Write(dir + "/generation_config.json", "{\"eos_token_id\": [151643, 151645]}");
  EXPECT_EQ(*ReadHfEosIds(dir), std::vector<int32_t>({151643, 151645}));
  Write(dir + "/generation_config.json", "{\"eos_token_id\": \"</s>\"}");
  EXPECT_EQ(ReadHfEosIds(dir).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ReadHfEosIds(FixtureDir("qwen2"))->empty());  // (null in its config)
}

// BF16 weights (what most checkpoints hold) load by conversion.
TEST(HfModelErrors, Bf16WeightsLoad) {
  HfLoadOptions options;
  auto policy = LoadHfModel(FixtureDir("qwen3"), options);
  ASSERT_TRUE(policy.ok());
  auto tensors = ReadSafetensors(FixtureDir("qwen3") + "/model.safetensors");
  ASSERT_TRUE(tensors.ok());
  std::map<std::string, TensorBlob> bf16;
  for (auto& [name, t] : *tensors) {
    TensorBlob b;
    b.dtype = "BF16";
    b.shape = t.shape;
    const float* f = reinterpret_cast<const float*>(t.bytes.data());
    for (size_t i = 0; i < t.bytes.size() / 4; ++i) {
      uint32_t u;
      std::memcpy(&u, f + i, 4);
      const uint16_t top = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);  // round to nearest even
      b.bytes.append(reinterpret_cast<const char*>(&top), 2);
    }
    bf16[name] = std::move(b);
  }
  const std::string dir = CopyOf("qwen3", "bf16", {"model.safetensors"});
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", bf16).ok());
  auto converted = LoadHfModel(dir, options);
  ASSERT_TRUE(converted.ok()) << converted.status();
  const Expected e = ReadExpected("qwen3");
  auto a = (*policy)->Logits(e.input_ids), b = (*converted)->Logits(e.input_ids);
  ASSERT_TRUE(a.ok() && b.ok());
  const float d = MaxAbsDiff(*a, *b);
  EXPECT_GT(d, 0.0f);   // (bf16 rounding moved something)
  EXPECT_LT(d, 0.25f);  // (and little)
}

}  // namespace
}  // namespace rlfleet::model

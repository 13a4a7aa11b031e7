// The Llama family (llama, qwen2, qwen3) against a forward pass written from the
// architectures' definitions in plain PyTorch (reference/reference_hf.py, Debian's
// python3-torch): on the fixtures transformers made (the reference agrees with
// transformers' logits too, so the three agree), and on models the fixtures do not
// cover (full multi-head and one key/value head, biases everywhere, a head_dim wider
// than d_model / n_heads, tied and untied heads, left-padded rows). Logits within 1e-4,
// greedy continuations identical.
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/model/hf_model.h"
#include "libs/model/policy.h"
#include "libs/model/safetensors.h"
#include "libs/model/test_util.h"
#include "tests/util/subprocess.h"

namespace rlfleet::model {
namespace {

using Rows = std::vector<std::vector<int32_t>>;

struct Reference {
  std::vector<float> logits;  // [batch][position][vocab]
  Rows greedy;                // [batch][n]
};

// reference_hf.py on `dir`: the logits of `tokens` (id `pad` is left padding when >= 0)
// and `greedy` tokens after each row.
Reference RunReference(const std::string& dir, const Rows& tokens, int pad, int greedy) {
  nlohmann::json request = {{"dir", dir}, {"tokens", tokens}, {"greedy", greedy}};
  if (pad >= 0) request["pad"] = pad;
  const std::string tmp = FreshTestDir("reference_call");
  std::ofstream(tmp + "/request.json") << request.dump();
  const std::string script = rlfleet::testing::RunfilePath("libs/model/reference/reference_hf.py");
  const std::string command =
      absl::StrCat("/usr/bin/python3 ", script, " < ", tmp, "/request.json > ", tmp, "/reply.json");
  Reference r;
  const int rc = std::system(command.c_str());
  EXPECT_EQ(rc, 0) << "the PyTorch reference failed (python3-torch installed? tools/setup.sh): " << command;
  if (rc != 0) return r;
  std::ifstream in(tmp + "/reply.json");
  const nlohmann::json reply = nlohmann::json::parse(in);
  for (const auto& row : reply["logits"]) {
    for (const auto& position : row) {
      for (const auto& v : position) r.logits.push_back(v.get<float>());
    }
  }
  r.greedy = reply["greedy"].get<Rows>();
  return r;
}

Rows Greedy(Policy* policy, const Rows& prompts, int n) {
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = n;
  greedy.eos_id = -1;
  auto generated = policy->Generate(prompts, greedy);
  EXPECT_TRUE(generated.ok()) << generated.status();
  Rows out;
  if (!generated.ok()) return out;
  for (const Generation& g : *generated) out.push_back(g.tokens);
  return out;
}

class FixtureModels : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureModels, OursThePyTorchReferenceAndTransformersAgree) {
  const std::string dir = rlfleet::testing::RunfilePath("libs/model/testdata/hf/" + GetParam());
  auto transformers = ReadHfFixtureExpected(dir);
  ASSERT_TRUE(transformers.ok()) << transformers.status();
  const Rows& input_ids = transformers->input_ids;
  const Reference reference = RunReference(dir, input_ids, -1, 16);
  EXPECT_LT(MaxAbsDiff(reference.logits, transformers->logits), 1e-4f) << "the reference is not transformers";

  auto policy = LoadHfModel(dir, HfLoadOptions{});
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto ours = (*policy)->Logits(input_ids);
  ASSERT_TRUE(ours.ok()) << ours.status();
  EXPECT_LT(MaxAbsDiff(*ours, reference.logits), 1e-4f);
  EXPECT_EQ(Greedy(policy->get(), input_ids, 16), reference.greedy);
}

INSTANTIATE_TEST_SUITE_P(Arch, FixtureModels, ::testing::Values("llama", "qwen2", "qwen3"));

// Configurations the fixtures do not cover.
struct Variant {
  std::string name;
  PolicyConfig config;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

std::vector<Variant> Variants() {
  PolicyConfig base;
  base.vocab_size = 80;
  base.d_model = 48;
  base.n_layers = 2;
  base.n_heads = 4;
  base.ffn_dim = 88;
  base.max_seq_len = 64;
  base.norm_eps = 1e-5;

  PolicyConfig llama = base;  // full multi-head attention, every bias, Llama 3's scaling
  llama.arch = "llama";
  llama.n_kv_heads = 4;
  llama.head_dim = 12;
  llama.qkv_bias = llama.o_bias = llama.mlp_bias = true;
  llama.rope_theta = 10000;
  llama.rope_factor = 4;
  llama.rope_low_freq_factor = 1;
  llama.rope_high_freq_factor = 2;
  llama.rope_original_max_positions = 16;

  PolicyConfig qwen2 = base;  // one key/value head, untied
  qwen2.arch = "qwen2";
  qwen2.n_kv_heads = 1;
  qwen2.head_dim = 12;
  qwen2.qkv_bias = true;
  qwen2.rope_theta = 1e6;

  PolicyConfig qwen3 = base;  // head_dim wider than d_model / n_heads, tied, biased
  qwen3.arch = "qwen3";
  qwen3.n_heads = 6;
  qwen3.n_kv_heads = 2;
  qwen3.head_dim = 20;
  qwen3.tie_embeddings = true;
  qwen3.qkv_bias = qwen3.o_bias = true;
  qwen3.qk_norm = true;
  qwen3.rope_theta = 5e5;
  return {{"llama_mha_biases_llama3", llama}, {"qwen2_one_kv_head", qwen2}, {"qwen3_wide_heads_tied", qwen3}};
}

// A random model of `config` in DIR: Policy::Create's weights, every tensor moved by
// noise (norm weights off one, biases off zero), written as a model directory.
std::string RandomModelDir(const Variant& v, uint32_t seed) {
  auto policy = Policy::Create(v.config, "cpu", seed);
  EXPECT_TRUE(policy.ok()) << policy.status();
  const std::string dir = FreshTestDir(v.name);
  EXPECT_TRUE(WriteHfModelDir(**policy, dir).ok());
  auto tensors = ReadSafetensors(dir + "/model.safetensors");
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  for (auto& [name, blob] : *tensors) {
    float* f = reinterpret_cast<float*>(blob.bytes.data());
    for (size_t i = 0; i < blob.bytes.size() / sizeof(float); ++i) f[i] += noise(rng);
  }
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", *tensors).ok());
  return dir;
}

class VariantModels : public ::testing::TestWithParam<Variant> {};

TEST_P(VariantModels, LogitsAndGreedyTokensMatchThePyTorchReference) {
  const std::string dir = RandomModelDir(GetParam(), 7);
  HfLoadOptions options;
  options.device = TestDevice();
  auto policy = LoadHfModel(dir, options);
  ASSERT_TRUE(policy.ok()) << policy.status();
  ASSERT_EQ(HfConfigJson((*policy)->config()), HfConfigJson(GetParam().config)) << "the directory is another model";

  // Three prompts of 11, 7 and 4 tokens (no id 0: it is the padding), left-padded to 11.
  const Rows prompts = {{5, 17, 3, 44, 61, 9, 28, 33, 70, 12, 8}, {21, 4, 56, 13, 77, 30, 6}, {49, 11, 38, 25}};
  Rows padded;
  for (const auto& p : prompts) {
    std::vector<int32_t> row(11 - p.size(), 0);
    row.insert(row.end(), p.begin(), p.end());
    padded.push_back(row);
  }
  const Reference reference = RunReference(dir, padded, 0, 12);
  auto ours = (*policy)->Logits(padded);
  ASSERT_TRUE(ours.ok()) << ours.status();
  // (A padded position's own logits are not defined by either; compare real positions.)
  const int vocab = GetParam().config.vocab_size;
  float worst = 0;
  for (size_t b = 0; b < padded.size(); ++b) {
    for (size_t t = 11 - prompts[b].size(); t < 11; ++t) {
      for (int k = 0; k < vocab; ++k) {
        const size_t i = (b * 11 + t) * vocab + k;
        worst = std::max(worst, std::fabs((*ours)[i] - reference.logits.at(i)));
      }
    }
  }
  EXPECT_LT(worst, 1e-4f) << "max |ours - reference| over the real positions";
  // Generate left-pads the prompts itself.
  EXPECT_EQ(Greedy(policy->get(), prompts, 12), reference.greedy);
}

INSTANTIATE_TEST_SUITE_P(Configs, VariantModels, ::testing::ValuesIn(Variants()),
                         [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

}  // namespace
}  // namespace rlfleet::model

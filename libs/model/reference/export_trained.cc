// Writes model directories as rlfleet's trainer writes its checkpoints, for
// check_from_pretrained.py to load with transformers on a machine that has it: each of
// the fixtures (libs/model/testdata/hf) and two configurations they do not cover, moved
// by one TrainStep, written with WriteHfModelDir (the source's config.json as the base),
// and beside each, rlfleet_expected.json: token rows, our logits for them and our 16
// greedy tokens after each row.
//
//   export_trained --fixtures=libs/model/testdata/hf --out=DIR
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "libs/model/hf_model.h"
#include "libs/model/policy.h"

ABSL_FLAG(std::string, fixtures, "libs/model/testdata/hf", "The fixture model directories (llama, qwen2, qwen3).");
ABSL_FLAG(std::string, out, "", "Where to write one directory per model.");

namespace {

using rlfleet::model::Policy;
using rlfleet::model::PolicyConfig;

absl::Status Export(std::unique_ptr<Policy> policy, const std::string& base, const std::string& dir) {
  std::vector<rlfleet::model::TrainSequence> batch(4);
  for (int i = 0; i < 4; ++i) {
    batch[i].prompt = {5, 6, 7, 8 + i};
    batch[i].response = {9, 10 + i, 11};
    batch[i].behaviour_logprobs = {-4.5f, -4.5f, -4.5f};
    batch[i].advantage = i % 2 ? 1.0f : -1.0f;
  }
  rlfleet::model::TrainOptions train;
  train.learning_rate = 1e-2f;
  if (auto stats = policy->TrainStep(batch, train); !stats.ok()) return stats.status();
  if (absl::Status s = rlfleet::model::WriteHfModelDir(*policy, dir, base); !s.ok()) return s;
  const std::vector<std::vector<int32_t>> rows = {{3, 14, 15, 9, 26, 53, 58, 9, 7, 93, 23, 8},
                                                  {27, 18, 28, 18, 28, 45, 90, 45, 23, 53, 60, 2}};
  auto logits = policy->Logits(rows);
  if (!logits.ok()) return logits.status();
  rlfleet::model::SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 16;
  greedy.eos_id = -1;
  auto generated = policy->Generate(rows, greedy);
  if (!generated.ok()) return generated.status();
  nlohmann::json expected = {{"input_ids", rows}, {"logits", *logits}, {"greedy", nlohmann::json::array()}};
  for (const auto& g : *generated) expected["greedy"].push_back(g.tokens);
  std::ofstream(dir + "/rlfleet_expected.json") << expected.dump();
  std::cout << "export_trained: " << dir << " (" << policy->config().arch << ", " << policy->num_parameters()
            << " parameters)\n";
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cerr << "usage: export_trained --fixtures=libs/model/testdata/hf --out=DIR\n";
    return 2;
  }
  std::filesystem::create_directories(out);
  for (const std::string arch : {"llama", "qwen2", "qwen3"}) {
    const std::string source = absl::GetFlag(FLAGS_fixtures) + "/" + arch;
    auto policy = rlfleet::model::LoadHfModel(source, {});
    absl::Status s = policy.ok() ? Export(std::move(*policy), source, out + "/" + arch) : policy.status();
    if (!s.ok()) {
      std::cerr << "export_trained: " << arch << ": " << s << "\n";
      return 1;
    }
  }
  PolicyConfig llama;  // full multi-head attention, every bias
  llama.arch = "llama";
  llama.vocab_size = 96;
  llama.d_model = 48;
  llama.n_layers = 2;
  llama.n_heads = 4;
  llama.n_kv_heads = 4;
  llama.head_dim = 12;
  llama.ffn_dim = 88;
  llama.max_seq_len = 64;
  llama.qkv_bias = llama.o_bias = llama.mlp_bias = true;
  PolicyConfig qwen3 = llama;  // tied, biased, head_dim wider than d_model / n_heads
  qwen3.arch = "qwen3";
  qwen3.n_heads = 6;
  qwen3.n_kv_heads = 2;
  qwen3.head_dim = 20;
  qwen3.mlp_bias = false;
  qwen3.tie_embeddings = true;
  qwen3.qk_norm = true;
  qwen3.rope_theta = 5e5;
  for (const auto& [name, config] : {std::pair{"llama_mha_biases", llama}, std::pair{"qwen3_tied_biases", qwen3}}) {
    auto policy = Policy::Create(config, "cpu", 3);
    absl::Status s = policy.ok() ? Export(std::move(*policy), "", out + "/" + name) : policy.status();
    if (!s.ok()) {
      std::cerr << "export_trained: " << name << ": " << s << "\n";
      return 1;
    }
  }
  return 0;
}

// Writes a tiny random Hugging Face model directory for a tokenizer: a Qwen2-architecture
// policy (grouped-query attention, q/k/v biases, tied embeddings) whose vocabulary is the
// tokenizer's, with config.json, model.safetensors, generation_config.json (its EOS:
// <|endoftext|> or <|im_end|>, when the tokenizer has one) and the tokenizer's files:
// what `--model_dir` takes, for trying the pipeline on a CPU without a real checkpoint.
//
//   make_tiny_model --tokenizer=DIR --out=DIR [--d_model=64 --n_layers=2 --n_heads=4]
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "libs/model/hf_model.h"
#include "libs/model/hf_tokenizer.h"
#include "libs/model/policy.h"

ABSL_FLAG(std::string, tokenizer, "", "Directory holding tokenizer.json (its files are copied).");
ABSL_FLAG(std::string, out, "", "The model directory to write.");
ABSL_FLAG(int, d_model, 64, "Width.");
ABSL_FLAG(int, n_layers, 2, "Layers.");
ABSL_FLAG(int, n_heads, 4, "Query heads (2 key/value heads).");
ABSL_FLAG(int, max_positions, 512, "max_position_embeddings.");
ABSL_FLAG(uint64_t, seed, 1, "Initial weights' seed.");

int main(int argc, char** argv) {
  rlfleet::model::ConfigureBlas(argv);
  absl::ParseCommandLine(argc, argv);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (absl::GetFlag(FLAGS_tokenizer).empty() || out.empty()) {
    std::cerr << "usage: make_tiny_model --tokenizer=DIR --out=DIR\n";
    return 2;
  }
  auto tokenizer = rlfleet::model::HfTokenizer::FromFile(absl::GetFlag(FLAGS_tokenizer));
  if (!tokenizer.ok()) {
    std::cerr << "make_tiny_model: " << tokenizer.status() << "\n";
    return 1;
  }
  rlfleet::model::PolicyConfig c;
  c.arch = "qwen2";
  c.vocab_size = (*tokenizer)->vocab_size();
  c.d_model = absl::GetFlag(FLAGS_d_model);
  c.n_layers = absl::GetFlag(FLAGS_n_layers);
  c.n_heads = absl::GetFlag(FLAGS_n_heads);
  c.n_kv_heads = 2;
  c.ffn_dim = 2 * c.d_model;
  c.qkv_bias = true;
  c.tie_embeddings = true;
  c.rope_theta = 1e6;
  c.max_seq_len = absl::GetFlag(FLAGS_max_positions);
  auto policy = rlfleet::model::Policy::Create(c, "cpu", absl::GetFlag(FLAGS_seed));
  if (!policy.ok()) {
    std::cerr << "make_tiny_model: " << policy.status() << "\n";
    return 1;
  }
  if (absl::Status s = rlfleet::model::WriteHfModelDir(**policy, out, absl::GetFlag(FLAGS_tokenizer)); !s.ok()) {
    std::cerr << "make_tiny_model: " << s << "\n";
    return 1;
  }
  for (const char* eos : {"<|endoftext|>", "<|im_end|>", "<|eot_id|>"}) {
    if (auto id = (*tokenizer)->TokenId(eos)) {
      std::ofstream(out + "/generation_config.json") << "{\"eos_token_id\": " << *id << "}\n";
      break;
    }
  }
  std::cout << "make_tiny_model: " << out << ": qwen2, vocabulary " << c.vocab_size << ", d_model " << c.d_model << ", "
            << c.n_layers << " layers, " << (*policy)->num_parameters() << " parameters\n";
  return 0;
}

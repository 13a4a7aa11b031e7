// Our side of bench/gpu/hf_qwen_bench.py: a Hugging Face model directory (hf_model.h)
// decoding given prompts greedily for exactly --new tokens (continuous batching through
// Policy::Generate, CUDA graphs on CUDA), best tokens/s of --repeats after a warm-up,
// peak device memory; then one GRPO TrainStep on the generated sequences (bf16 autocast
// with fp32 master weights, or fp32), its time and peak memory. Prompts come from and
// tokens go to JSON files (lists of id lists), so that the script compares them with
// transformers' on the same prompts. Prints one JSON line.
//
//   hf_decode --model_dir=DIR --prompts=prompts.json --tokens_out=ours.json --device=cuda --dtype=bf16
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/random/random.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libs/model/hf_model.h"
#include "libs/model/policy.h"

ABSL_FLAG(std::string, model_dir, "", "Hugging Face model directory.");
ABSL_FLAG(std::string, prompts, "", "JSON file: a list of prompts, each a list of token ids.");
ABSL_FLAG(std::string, tokens_out, "", "Where the generated tokens go (JSON, a list per prompt); empty: nowhere.");
ABSL_FLAG(int, new_tokens, 128, "New tokens per prompt (no early stop).");
ABSL_FLAG(int, repeats, 3, "Timed runs after one warm-up; the best is kept.");
ABSL_FLAG(std::string, device, "cuda", "Device.");
ABSL_FLAG(std::string, dtype, "bf16", "Decode dtype: fp32, bf16, fp16.");
ABSL_FLAG(std::string, train_precision, "bf16", "The GRPO step: bf16 (autocast, fp32 weights) or fp32; none skips.");
ABSL_FLAG(int, micro_batch, 16, "Sequences per forward/backward in the train step.");

int main(int argc, char** argv) {
  rlfleet::model::ConfigureBlas(argv);
  absl::ParseCommandLine(argc, argv);
  const std::string device = absl::GetFlag(FLAGS_device);
  std::ifstream in(absl::GetFlag(FLAGS_prompts));
  const nlohmann::json prompts_json = nlohmann::json::parse(in, nullptr, false);
  if (prompts_json.is_discarded() || !prompts_json.is_array()) {
    std::cerr << "hf_decode: --prompts: not a JSON list\n";
    return 2;
  }
  const auto prompts = prompts_json.get<std::vector<std::vector<int32_t>>>();
  rlfleet::model::HfLoadOptions load;
  load.device = device;
  load.dtype = absl::GetFlag(FLAGS_dtype);
  load.max_seq_len = static_cast<int>(prompts.at(0).size()) + absl::GetFlag(FLAGS_new_tokens) + 1;
  absl::Time t0 = absl::Now();
  auto policy = rlfleet::model::LoadHfModel(absl::GetFlag(FLAGS_model_dir), load);
  if (!policy.ok()) {
    std::cerr << "hf_decode: " << policy.status() << "\n";
    return 1;
  }
  const double load_s = absl::ToDoubleSeconds(absl::Now() - t0);
  rlfleet::model::SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = absl::GetFlag(FLAGS_new_tokens);
  greedy.eos_id = -1;
  (void)rlfleet::model::DevicePeakBytes(device, /*reset=*/true);
  absl::StatusOr<std::vector<rlfleet::model::Generation>> out = (*policy)->Generate(prompts, greedy);  // (warm-up)
  double best = 0;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats) && out.ok(); ++r) {
    const absl::Time start = absl::Now();
    out = (*policy)->Generate(prompts, greedy);
    best = std::max(best, prompts.size() * greedy.max_new_tokens / absl::ToDoubleSeconds(absl::Now() - start));
  }
  if (!out.ok()) {
    std::cerr << "hf_decode: " << out.status() << "\n";
    return 1;
  }
  const absl::StatusOr<int64_t> decode_peak = rlfleet::model::DevicePeakBytes(device, /*reset=*/false);
  if (!absl::GetFlag(FLAGS_tokens_out).empty()) {
    nlohmann::json tokens = nlohmann::json::array();
    for (const auto& g : *out) tokens.push_back(g.tokens);
    std::ofstream(absl::GetFlag(FLAGS_tokens_out)) << tokens.dump();
  }
  nlohmann::json line = {{"side", "ours"},
                         {"batch", prompts.size()},
                         {"new_tokens", greedy.max_new_tokens},
                         {"dtype", load.dtype},
                         {"decode", (*policy)->DecodeMode()},
                         {"load_s", load_s},
                         {"tokens_per_s", best},
                         {"decode_peak_bytes", decode_peak.ok() ? *decode_peak : -1}};
  const std::string precision = absl::GetFlag(FLAGS_train_precision);
  if (precision != "none") {
    // The GRPO step on what was generated: a separate fp32 policy (the trainer's), the
    // sequences in groups of 8 with alternating advantages.
    policy->reset();
    load.dtype = "fp32";
    auto trainer = rlfleet::model::ReadHfConfig(absl::GetFlag(FLAGS_model_dir));
    rlfleet::model::PolicyConfig config = *trainer;
    config.max_seq_len = load.max_seq_len;
    config.bf16_autocast = precision == "bf16";
    auto train_policy = rlfleet::model::Policy::Create(config, device);
    if (!train_policy.ok() ||
        !rlfleet::model::LoadHfWeights(absl::GetFlag(FLAGS_model_dir), train_policy->get()).ok()) {
      std::cerr << "hf_decode: the train policy did not load\n";
      return 1;
    }
    std::vector<rlfleet::model::TrainSequence> batch;
    for (size_t i = 0; i < prompts.size(); ++i) {
      rlfleet::model::TrainSequence s;
      s.prompt = prompts[i];
      s.response = (*out)[i].tokens;
      s.behaviour_logprobs = (*out)[i].logprobs;
      s.advantage = (i % 2) ? 1.0f : -1.0f;
      batch.push_back(std::move(s));
    }
    rlfleet::model::TrainOptions options;
    options.learning_rate = 1e-6f;
    options.micro_batch_size = absl::GetFlag(FLAGS_micro_batch);
    (void)rlfleet::model::DevicePeakBytes(device, /*reset=*/true);
    auto first = (*train_policy)->TrainStep(batch, options);  // (the first allocates the optimizer state)
    const absl::Time start = absl::Now();
    auto stats = (*train_policy)->TrainStep(batch, options);
    const double step_s = absl::ToDoubleSeconds(absl::Now() - start);
    const absl::StatusOr<int64_t> train_peak = rlfleet::model::DevicePeakBytes(device, /*reset=*/false);
    if (!first.ok() || !stats.ok()) {
      std::cerr << "hf_decode: TrainStep: " << (first.ok() ? stats.status() : first.status()) << "\n";
      return 1;
    }
    line["train_precision"] = precision;
    line["train_step_s"] = step_s;
    line["train_tokens"] = stats->tokens;
    line["train_peak_bytes"] = train_peak.ok() ? *train_peak : -1;
    line["train_loss"] = stats->loss;
  }
  std::cout << line.dump() << std::endl;
  return 0;
}

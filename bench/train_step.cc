// train_step: trained tokens/s of libs/model's Policy::TrainStep against the same model,
// batch and GRPO/PPO step in PyTorch eager (libs/model/reference/reference_train_step.py), in one run on
// one device. Configs as bench/rollout_tokens: (a) vocab 32, d 128, 4 layers, 4 heads;
// (b) vocab 32, d 256, 6 layers, 8 heads; prompt 16 + response 48 tokens, --batch
// sequences. Best of --steps timed steps after a warm-up, each side alternating by
// round. Writes a table to --out; the last line:
// train_ratio_vs_torch_eager=<ours / eager for (b)>.
//   bazel run -c opt //bench:train_step -- --out=$PWD/bench/results/train_step.md
//   on the GPU machine: bench/gpu/run_gpu_bench.sh (--device=cuda)
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/cpu_model.h"
#include "bench/json_command.h"
#include "libs/model/policy.h"

ABSL_FLAG(std::string, out, "train_step.md", "Where the results table is written.");
ABSL_FLAG(std::string, device, "cpu", "Where both sides run: cpu, cuda, cuda:N.");
ABSL_FLAG(std::string, precision, "fp32", "fp32, or bf16 (autocast forward, fp32 weights) on both sides.");
ABSL_FLAG(int, batch, 32, "Sequences per step.");
ABSL_FLAG(int, steps, 5, "Timed steps per round (after one warm-up step); the best is kept.");
ABSL_FLAG(int, rounds, 2, "Rounds alternating the two sides.");
ABSL_FLAG(int, threads, 2, "Intra-op threads (CPU).");
ABSL_FLAG(std::string, torch_script, "libs/model/reference/reference_train_step.py",
          "The PyTorch-eager side; empty: ours only.");
ABSL_FLAG(std::string, python, "python3", "The Python that runs --torch_script (with torch).");

namespace {

struct Config {
  const char* name;
  rlfleet::model::PolicyConfig model;
};

constexpr int kPrompt = 16, kResponse = 48;

double Eager(const Config& c, const std::string& weights) {
  const std::string cmd =
      absl::StrCat(absl::GetFlag(FLAGS_python), " ", absl::GetFlag(FLAGS_torch_script), " ", weights, " ",
                   c.model.d_model, " ", c.model.n_layers, " ", c.model.n_heads, " ", c.model.vocab_size, " ",
                   absl::GetFlag(FLAGS_batch), " ", kPrompt, " ", kResponse, " ", absl::GetFlag(FLAGS_steps), " ",
                   absl::GetFlag(FLAGS_device), " ", absl::GetFlag(FLAGS_precision));
  int rc = 0;
  const std::string json = rlfleet::bench::CommandOutput(cmd, &rc);
  const std::optional<double> tokens_per_s = rlfleet::bench::JsonNumber(json, "tokens_per_s");
  if (rc != 0 || !tokens_per_s) {
    std::cerr << "train_step: the eager side failed (exit " << rc << "): " << cmd << "\n" << json << "\n";
    return -1;
  }
  return *tokens_per_s;
}

}  // namespace

int main(int argc, char** argv) {
  rlfleet::model::ConfigureBlas(argv);
  absl::ParseCommandLine(argc, argv);
  rlfleet::model::SetComputeThreads(absl::GetFlag(FLAGS_threads));
  const std::string device = absl::GetFlag(FLAGS_device), precision = absl::GetFlag(FLAGS_precision);
  if (precision != "fp32" && precision != "bf16") {
    std::cerr << "train_step: --precision is fp32 or bf16, not " << precision << "\n";
    return 2;
  }
  const bool eager_side = !absl::GetFlag(FLAGS_torch_script).empty();
  std::vector<Config> configs = {{"a", {32, 128, 4, 4, 64, false}}, {"b", {32, 256, 6, 8, 112, false}}};
  std::ofstream out(absl::GetFlag(FLAGS_out));
  out << "# train_step: Policy::TrainStep (C++ libtorch) vs the same step in PyTorch eager\n\n"
      << "device " << device << " (" << rlfleet::model::ModelBackend() << "), CPU " << rlfleet::bench::CpuModel()
      << ", precision " << precision << ", batch " << absl::GetFlag(FLAGS_batch) << " x (" << kPrompt << " prompt + "
      << kResponse << " response) tokens, best of " << absl::GetFlag(FLAGS_rounds) << " rounds x "
      << absl::GetFlag(FLAGS_steps) << " steps per side\n\n"
      << "| config | ours (tokens/s) | eager (tokens/s) | ours / eager |\n|---|---:|---:|---:|\n";
  double headline = -1;
  for (Config& c : configs) {
    c.model.bf16_autocast = precision == "bf16";
    auto policy = rlfleet::model::Policy::Create(c.model, device, 1);
    if (!policy.ok()) {
      std::cerr << "train_step: " << policy.status() << "\n";
      return 1;
    }
    const std::string weights = absl::StrCat("/tmp/train_step_", getpid(), "_", c.name, ".safetensors");
    if (absl::Status s = (*policy)->SaveSafetensors(weights); !s.ok()) {
      std::cerr << "train_step: " << s << "\n";
      return 1;
    }
    absl::BitGen gen;
    std::vector<rlfleet::model::TrainSequence> batch(absl::GetFlag(FLAGS_batch));
    for (size_t i = 0; i < batch.size(); ++i) {
      for (int j = 0; j < kPrompt; ++j) batch[i].prompt.push_back(absl::Uniform(gen, 4, 32));
      for (int j = 0; j < kResponse; ++j) batch[i].response.push_back(absl::Uniform(gen, 4, 32));
      batch[i].behaviour_logprobs.assign(kResponse, -3.0f);
      batch[i].advantage = i % 2 ? 1.0f : -0.5f;
    }
    rlfleet::model::TrainOptions options;
    options.learning_rate = 1e-5f;
    options.entropy_coef = 0.01;
    double ours = 0, eager = 0;
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      for (int i = 0; i <= absl::GetFlag(FLAGS_steps); ++i) {  // (step 0: the warm-up)
        const absl::Time start = absl::Now();
        auto stats = (*policy)->TrainStep(batch, options);  // (its statistics are on the host: synchronised)
        const double s = absl::ToDoubleSeconds(absl::Now() - start);
        if (!stats.ok()) {
          std::cerr << "train_step: " << stats.status() << "\n";
          return 1;
        }
        if (i > 0) ours = std::max(ours, batch.size() * kResponse / s);
      }
      if (eager_side) eager = std::max(eager, Eager(c, weights));
    }
    std::remove(weights.c_str());
    if (eager_side && eager <= 0) return 1;
    const double ratio = eager > 0 ? ours / eager : -1;
    std::cerr << absl::StrFormat("config %s: ours %8.0f tok/s  eager %8.0f tok/s  ratio %.2f\n", c.name, ours, eager,
                                 ratio);
    out << (eager_side ? absl::StrFormat("| %s | %.0f | %.0f | %.2f |\n", c.name, ours, eager, ratio)
                       : absl::StrFormat("| %s | %.0f | not run | - |\n", c.name, ours));
    if (c.name == std::string("b")) headline = ratio;
  }
  const std::string ratio_line = eager_side
                                     ? absl::StrFormat("train_ratio_vs_torch_eager=%.3f", headline)
                                     : "train_ratio_vs_torch_eager: not measured (--torch_script= runs ours only)";
  out << "\n" << ratio_line << "\n";
  std::cout << "table written to " << absl::GetFlag(FLAGS_out) << "\n" << ratio_line << std::endl;
  return 0;
}

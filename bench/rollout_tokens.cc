// rollout_tokens: generated tokens/s of libs/model's Policy::Generate against the same
// model and decode algorithm in PyTorch eager (bench/rollout_tokens_torch.py), in the
// same run, both with --threads threads (OpenBLAS). Configs: (a) vocab 32, d 128,
// 4 layers, 4 heads, prompt 16, 48 new; (b) vocab 32, d 256, 6 layers, 8 heads,
// prompt 16, 96 new; batch 1, 8, 32. Best of --repeats each. Writes a table to --out;
// last line: rollout_ratio_vs_torch_eager=<ours / eager for (a) at batch 32>.
//   bazel run //bench:rollout_tokens -- --out=$PWD/bench/results/rollout_tokens.md
// On a GPU (bench/gpu/run_gpu_bench.sh, against Hugging Face generate there):
// --device=cuda --torch_script= (ours only) --batches=32,256 --dtype=bf16 --jsonl=FILE.
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/json_command.h"
#include "libs/model/policy.h"

ABSL_FLAG(std::string, out, "rollout_tokens.md", "Where the results table is written.");
ABSL_FLAG(int, threads, 2, "Intra-op threads for both sides.");
ABSL_FLAG(int, repeats, 3, "Runs of each measurement per round; the best is kept.");
ABSL_FLAG(int, rounds, 2, "Rounds alternating the two sides; the best of all is kept.");
ABSL_FLAG(std::string, torch_script, "bench/rollout_tokens_torch.py",
          "The PyTorch-eager side (CPU); empty: ours only.");
ABSL_FLAG(std::string, device, "cpu", "Where our side runs: cpu, cuda, cuda:N.");
ABSL_FLAG(std::vector<std::string>, batches, std::vector<std::string>({"1", "8", "32"}), "Batch sizes, e.g. 32,256.");
ABSL_FLAG(std::string, dtype, "fp32", "Our side's weights, activations and KV cache: fp32, bf16, fp16 (CUDA).");
ABSL_FLAG(bool, cuda_graphs, true, "On CUDA, decode steps replay CUDA graphs (PolicyConfig::cuda_graphs).");
ABSL_FLAG(std::string, jsonl, "",
          "Also append one JSON line per (config, batch) here: tokens/s and, on CUDA, peak device memory "
          "(bench/gpu/run_gpu_bench.sh merges them with Hugging Face's).");

namespace {

struct Config {
  const char* name;
  rlfleet::model::PolicyConfig model;
  int prompt;
  int new_tokens;
};

std::string Blas() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("openblas") != std::string::npos) return "OpenBLAS";
    if (line.find("libblas.so") != std::string::npos) return "reference BLAS (libblas)";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  rlfleet::model::ConfigureBlas(argv);
  absl::ParseCommandLine(argc, argv);
  const int threads = absl::GetFlag(FLAGS_threads);
  rlfleet::model::SetComputeThreads(threads);
  std::vector<Config> configs(2);
  configs[0] = {"a", {32, 128, 4, 4, 64, false}, 16, 48};
  configs[1] = {"b", {32, 256, 6, 8, 112, false}, 16, 96};
  std::vector<int> batches;
  for (const std::string& b : absl::GetFlag(FLAGS_batches)) {
    int n = 0;
    if (!absl::SimpleAtoi(b, &n) || n < 1) {
      std::cerr << "rollout_tokens: --batches: " << b << " is not a batch size\n";
      return 2;
    }
    batches.push_back(n);
  }
  const std::string device = absl::GetFlag(FLAGS_device);
  const bool cuda = device.rfind("cuda", 0) == 0;
  std::ofstream jsonl;
  if (!absl::GetFlag(FLAGS_jsonl).empty()) jsonl.open(absl::GetFlag(FLAGS_jsonl), std::ios::app);
  for (Config& c : configs) {
    c.model.dtype = absl::GetFlag(FLAGS_dtype);
    c.model.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  }
  std::ofstream out(absl::GetFlag(FLAGS_out));
  out << "# rollout_tokens: Policy::Generate (C++ libtorch) vs PyTorch eager, same model and algorithm\n\n"
      << "device " << absl::GetFlag(FLAGS_device) << ", threads " << threads << ", best of "
      << absl::GetFlag(FLAGS_rounds) << " rounds x " << absl::GetFlag(FLAGS_repeats)
      << " runs per side, the sides alternating by round\n\n"
      << "| config | batch | ours (tokens/s) | eager (tokens/s) | ratio |\n|---|---:|---:|---:|---:|\n";
  double headline = 0;
  std::string eager_blas;
  for (const Config& c : configs) {
    auto policy = rlfleet::model::Policy::Create(c.model, device, 1);
    if (!policy.ok()) {
      std::cerr << policy.status() << "\n";
      return 1;
    }
    const std::string weights = absl::StrCat("/tmp/rollout_tokens_", getpid(), "_", c.name, ".safetensors");
    if (!(*policy)->SaveSafetensors(weights).ok()) return 1;
    std::cerr << "config " << c.name << ": decode " << (*policy)->DecodeMode() << ", " << c.model.dtype << "\n";
    for (int batch : batches) {
      if (cuda) (void)rlfleet::model::DevicePeakBytes(device, /*reset=*/true);
      absl::BitGen gen;
      std::vector<std::vector<int32_t>> prompts(batch);
      for (auto& p : prompts) {
        for (int i = 0; i < c.prompt; ++i) p.push_back(absl::Uniform(gen, 4, 32));
      }
      rlfleet::model::SamplingOptions options;
      options.max_new_tokens = c.new_tokens;
      options.eos_id = -1;  // equal work on both sides: no early stop
      // Rounds alternate the two sides so that a slow spell of this shared machine
      // lands on both; each side keeps its best.
      double ours = 0, eager = 0;
      for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
        for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
          options.seed = r;
          const absl::Time start = absl::Now();
          auto result = (*policy)->Generate(prompts, options);
          const double s = absl::ToDoubleSeconds(absl::Now() - start);
          if (!result.ok()) {
            std::cerr << result.status() << "\n";
            return 1;
          }
          ours = std::max(ours, batch * c.new_tokens / s);
        }
        if (absl::GetFlag(FLAGS_torch_script).empty()) continue;
        const std::string cmd =
            absl::StrCat("OPENBLAS_NUM_THREADS=1 /usr/bin/python3 ", absl::GetFlag(FLAGS_torch_script), " ", weights,
                         " ", c.model.d_model, " ", c.model.n_layers, " ", c.model.n_heads, " ", c.model.vocab_size,
                         " ", batch, " ", c.prompt, " ", c.new_tokens, " ", threads, " ", absl::GetFlag(FLAGS_repeats));
        int exit_code = 0;
        const std::string json = rlfleet::bench::CommandOutput(cmd, &exit_code);
        eager = std::max(eager, rlfleet::bench::JsonNumber(json, "tokens_per_s").value_or(0));
        if (const size_t b = json.find("\"blas\": \""); b != std::string::npos) {
          eager_blas = json.substr(b + 9, json.find('"', b + 9) - b - 9);
        }
      }
      const double ratio = eager > 0 ? ours / eager : 0;
      if (jsonl.is_open()) {
        absl::StatusOr<int64_t> peak = rlfleet::model::DevicePeakBytes(device, false);
        jsonl << absl::StrFormat(R"({"side": "ours", "config": "%s", "batch": %d, "dtype": "%s", "decode": "%s", )"
                                 R"("tokens_per_s": %.1f, "peak_bytes": %d})",
                                 c.name, batch, c.model.dtype, (*policy)->DecodeMode(), ours, peak.ok() ? *peak : -1)
              << std::endl;
      }
      if (absl::GetFlag(FLAGS_torch_script).empty()) {  // (ours only: no eager column to divide by)
        std::cerr << absl::StrFormat("config %s batch %2d: ours %8.0f tok/s  (eager not run)\n", c.name, batch, ours);
        out << absl::StrFormat("| %s | %d | %.0f | not run | - |\n", c.name, batch, ours);
      } else {
        std::cerr << absl::StrFormat("config %s batch %2d: ours %8.0f tok/s  eager %8.0f tok/s  ratio %.2f\n", c.name,
                                     batch, ours, eager, ratio);
        out << absl::StrFormat("| %s | %d | %.0f | %.0f | %.2f |\n", c.name, batch, ours, eager, ratio);
      }
      if (c.name == std::string("a") && batch == 32) headline = ratio;
    }
    std::remove(weights.c_str());
  }
  const char* core = getenv("OPENBLAS_CORETYPE");
  out << "\nBLAS: ours " << Blas() << "; eager: " << eager_blas << "\n"
      << "\nOpenBLAS kernels (both sides; the eager side inherits the environment): "
      << (core != nullptr ? absl::StrCat("OPENBLAS_CORETYPE=", core) : std::string("detected by OpenBLAS")) << "\n"
      << "\n";
  // (without the eager side there is no ratio: say so rather than print 0)
  const std::string ratio_line = absl::GetFlag(FLAGS_torch_script).empty()
                                     ? "rollout_ratio_vs_torch_eager: not measured (--torch_script= runs ours only)"
                                     : absl::StrFormat("rollout_ratio_vs_torch_eager=%.3f", headline);
  out << ratio_line << "\n";
  std::cout << "table written to " << absl::GetFlag(FLAGS_out) << "\n" << ratio_line << std::endl;
  return 0;
}

// wire_precision: what sending weights in bf16 / fp16 (libs/reshard's cast, the
// gradients' --dp_wire) does to a policy. The demo-size policy (d_model 128, 4 layers,
// vocab 32) with every weight rounded to bf16 or fp16 against the fp32 original on
// --prompts random prompts: max |logit difference|, mean KL(fp32 || rounded) of the
// next-token distributions, and how often the greedy token is the same. (The gradient
// side, the all-reduce's error with a 16-bit wire, is in bench/hierarchical_allreduce.)
//   bazel run -c opt //bench:wire_precision -- --out=$PWD/bench/results/wire_precision.md
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/dist/ring_collectives.h"
#include "libs/model/policy.h"
#include "libs/model/safetensors.h"

ABSL_FLAG(std::string, out, "wire_precision.md", "Where the table is written.");
ABSL_FLAG(int, prompts, 256, "Random prompts (16 tokens each).");

namespace {

// The policy's weights rounded through a 16-bit format, as a new policy.
std::unique_ptr<rlfleet::model::Policy> Rounded(rlfleet::model::Policy& policy, bool bf16) {
  const std::string path = absl::StrCat("/tmp/wire_precision_", getpid(), ".safetensors");
  if (!policy.SaveSafetensors(path).ok()) std::exit(1);
  auto tensors = rlfleet::model::ReadSafetensors(path);
  if (!tensors.ok()) std::exit(1);
  for (auto& [name, blob] : *tensors) {
    float* x = reinterpret_cast<float*>(blob.bytes.data());
    for (size_t i = 0; i < blob.bytes.size() / 4; ++i) {
      x[i] = bf16 ? rlfleet::dist::FromBf16(rlfleet::dist::ToBf16(x[i]))
                  : rlfleet::dist::FromFp16(rlfleet::dist::ToFp16(x[i]));
    }
  }
  if (!rlfleet::model::WriteSafetensors(path, *tensors).ok()) std::exit(1);
  auto rounded = rlfleet::model::Policy::Create(policy.config(), "cpu", 1);
  if (!rounded.ok() || !(*rounded)->LoadSafetensors(path).ok()) std::exit(1);
  std::remove(path.c_str());
  return std::move(*rounded);
}

}  // namespace

int main(int argc, char** argv) {
  rlfleet::model::ConfigureBlas(argv);
  absl::ParseCommandLine(argc, argv);
  rlfleet::model::PolicyConfig config;
  config.vocab_size = 32;
  config.d_model = 128;
  config.n_layers = 4;
  config.n_heads = 4;
  config.max_seq_len = 64;
  auto policy = rlfleet::model::Policy::Create(config, "cpu", 3);
  if (!policy.ok()) return 1;
  std::mt19937 gen(5);
  std::uniform_int_distribution<int> token(4, 31);
  std::vector<std::vector<int32_t>> prompts(absl::GetFlag(FLAGS_prompts), std::vector<int32_t>(16));
  for (auto& p : prompts) {
    for (auto& t : p) t = token(gen);
  }
  const std::vector<float> want = *(*policy)->Logits(prompts);
  std::ofstream out(absl::GetFlag(FLAGS_out));
  out << "# wire_precision: the policy's weights through bf16 / fp16\n\n"
      << "d_model 128, 4 layers, vocab 32, random init (std 0.02 weights); " << prompts.size()
      << " random 16-token prompts, next-token distributions at every position.\n\n"
      << "| weights | max abs logit difference | logit std (fp32) | mean KL(fp32 || rounded), nats | greedy token "
         "unchanged |\n"
      << "|---|---:|---:|---:|---:|\n";
  double mean = 0, var = 0;
  for (float v : want) mean += v / want.size();
  for (float v : want) var += (v - mean) * (v - mean) / want.size();
  for (bool bf16 : {true, false}) {
    auto rounded = Rounded(**policy, bf16);
    const std::vector<float> got = *rounded->Logits(prompts);
    const size_t vocab = config.vocab_size, rows = want.size() / vocab;
    double max_diff = 0, kl = 0;
    size_t same = 0;
    for (size_t r = 0; r < rows; ++r) {
      const float* a = &want[r * vocab];
      const float* b = &got[r * vocab];
      double za = 0, zb = 0, ma = -1e30, mb = -1e30;
      size_t ia = 0, ib = 0;
      for (size_t v = 0; v < vocab; ++v) {
        max_diff = std::max<double>(max_diff, std::abs(a[v] - b[v]));
        if (a[v] > ma) ma = a[v], ia = v;
        if (b[v] > mb) mb = b[v], ib = v;
      }
      for (size_t v = 0; v < vocab; ++v) za += std::exp(a[v] - ma), zb += std::exp(b[v] - mb);
      for (size_t v = 0; v < vocab; ++v) {
        const double pa = std::exp(a[v] - ma) / za, pb = std::exp(b[v] - mb) / zb;
        kl += pa * (std::log(pa) - std::log(pb)) / rows;
      }
      same += ia == ib;
    }
    const std::string row = absl::StrFormat("| %s | %.2e | %.3f | %.2e | %.4f |", bf16 ? "bf16" : "fp16", max_diff,
                                            std::sqrt(var), kl, static_cast<double>(same) / rows);
    std::cout << row << std::endl;
    out << row << "\n";
  }
  std::cout << "table written to " << absl::GetFlag(FLAGS_out) << std::endl;
  return 0;
}

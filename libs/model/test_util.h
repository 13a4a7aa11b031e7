// Helpers for the tests of code that runs a Policy (test-only).
#ifndef RLFLEET_LIBS_MODEL_TEST_UTIL_H_
#define RLFLEET_LIBS_MODEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/model/policy.h"
#include "libs/model/safetensors.h"

namespace rlfleet::model {

// The device the tests of code that runs a Policy use: $RLFLEET_TEST_DEVICE (cuda:0 on
// a GPU host: tools/device/run_gpu_tests.sh), cpu when unset.
inline std::string TestDevice() {
  const char* device = std::getenv("RLFLEET_TEST_DEVICE");
  return device != nullptr && *device != '\0' ? device : "cpu";
}

// A model small enough for unit tests: vocabulary 32, width 32, 2 blocks of 4 heads.
inline PolicyConfig TinyConfig(int max_seq_len = 32, bool value_head = false) {
  PolicyConfig c;
  c.vocab_size = 32;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.max_seq_len = max_seq_len;
  c.value_head = value_head;
  return c;
}

// `c` as the Llama family's `arch` (llama / qwen2 / qwen3) with every feature it has
// on at once: grouped-query attention (2 key/value heads), a head_dim that is not
// d_model / n_heads, q/k norms, biases, tied embeddings and Llama 3's rope scaling.
// "gpt" returns `c` as it is.
inline PolicyConfig WithArch(PolicyConfig c, const std::string& arch) {
  if (arch == "gpt") return c;
  c.arch = arch;
  c.n_kv_heads = 2;
  c.head_dim = 12;
  c.ffn_dim = 2 * c.d_model;
  c.tie_embeddings = true;
  c.qkv_bias = c.o_bias = true;
  c.qk_norm = true;
  c.rope_theta = 500;
  c.rope_factor = 4;
  c.rope_original_max_positions = 16;
  return c;
}

// An empty directory `name` under the test's TEST_TMPDIR (emptied if it was there).
inline std::string FreshTestDir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(std::getenv("TEST_TMPDIR")) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// What transformers computed for a model fixture (libs/model/testdata/hf/<arch>/
// expected.safetensors, reference/make_hf_fixtures.py).
struct HfFixtureExpected {
  std::vector<std::vector<int32_t>> input_ids;  // [2][12]
  std::vector<float> logits;                    // [2][12][vocab]
  std::vector<std::vector<int32_t>> greedy;     // [2][12 + 16]
};

inline absl::StatusOr<HfFixtureExpected> ReadHfFixtureExpected(const std::string& dir) {
  auto tensors = ReadSafetensors(dir + "/expected.safetensors");
  if (!tensors.ok()) return tensors.status();
  auto rows = [](const TensorBlob& t) {
    std::vector<std::vector<int32_t>> out(t.shape[0]);
    const int64_t* v = reinterpret_cast<const int64_t*>(t.bytes.data());
    for (int64_t b = 0; b < t.shape[0]; ++b) out[b].assign(v + b * t.shape[1], v + (b + 1) * t.shape[1]);
    return out;
  };
  HfFixtureExpected e;
  e.input_ids = rows(tensors->at("input_ids"));
  e.greedy = rows(tensors->at("greedy"));
  const TensorBlob& logits = tensors->at("logits");
  const float* f = reinterpret_cast<const float*>(logits.bytes.data());
  e.logits.assign(f, f + logits.bytes.size() / sizeof(float));
  return e;
}

inline float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = a.size() == b.size() ? 0.0f : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// `n` training sequences of different lengths (1-4 response tokens and EOS), with
// alternating advantages, so that data-parallel ranks hold different token counts.
inline std::vector<TrainSequence> VariedBatch(int n) {
  std::vector<TrainSequence> batch;
  for (int i = 0; i < n; ++i) {
    TrainSequence s;
    s.prompt = {1, 4, 5 + i};
    for (int j = 0; j <= i % 4; ++j) s.response.push_back(6 + (i + j) % 20);
    s.response.push_back(2);
    s.behaviour_logprobs.assign(s.response.size(), -3.0f);
    s.advantage = i % 2 ? 1.0f : -0.5f;
    batch.push_back(std::move(s));
  }
  return batch;
}

}  // namespace rlfleet::model

#endif  // RLFLEET_LIBS_MODEL_TEST_UTIL_H_

// Helpers for the tests of code that runs a Policy (test-only).
#ifndef RLFLEET_LIBS_MODEL_TEST_UTIL_H_
#define RLFLEET_LIBS_MODEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "libs/model/policy.h"

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

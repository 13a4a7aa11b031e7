// Helpers for the tests of code that runs a Policy (test-only).
#ifndef RLFLEET_LIBS_MODEL_TEST_UTIL_H_
#define RLFLEET_LIBS_MODEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <vector>

#include "libs/model/policy.h"

namespace rlfleet::model {

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

}  // namespace rlfleet::model

#endif  // RLFLEET_LIBS_MODEL_TEST_UTIL_H_

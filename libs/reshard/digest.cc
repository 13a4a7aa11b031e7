#include "libs/reshard/digest.h"

#include <cstring>
#include <vector>

namespace rlfleet::reshard {
namespace {

const uint64_t* MixTable() {
  static const std::vector<uint64_t>* table = [] {
    auto* t = new std::vector<uint64_t>(1 << 16);
    for (uint32_t u = 0; u < t->size(); ++u) (*t)[u] = DigestFmix32(u + kDigestSalt);
    return t;
  }();
  return table->data();
}

}  // namespace

uint64_t DigestBytes(const void* data, uint64_t bytes, uint64_t shard_offset) {
  const uint64_t* table = MixTable();
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint64_t n = bytes / 2;
  uint64_t weight = 2 * (shard_offset / 2) + 1;
  uint64_t sum0 = 0, sum1 = 0;
  uint64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    uint16_t u[2];
    std::memcpy(u, p + 2 * i, 4);
    sum0 += table[u[0]] * weight;
    sum1 += table[u[1]] * (weight + 2);
    weight += 4;
  }
  if (i < n) {
    uint16_t u;
    std::memcpy(&u, p + 2 * i, 2);
    sum0 += table[u] * weight;
  }
  return sum0 + sum1;
}

}  // namespace rlfleet::reshard

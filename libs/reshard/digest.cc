#include "libs/reshard/digest.h"

#include <immintrin.h>

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

// Units [0, n) of `p`, unit 0 at shard index `first`: the portable version.
uint64_t DigestScalar(const uint8_t* p, uint64_t n, uint64_t first) {
  const uint64_t* table = MixTable();
  uint64_t weight = 2 * first + 1;
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

// The same with AVX2: 8 units per step, Fmix32 computed in lanes, the 32 x 64-bit
// product mod 2^64 from two 32 x 32 -> 64 multiplies.
__attribute__((target("avx2"))) uint64_t DigestAvx2(const uint8_t* p, uint64_t n, uint64_t first) {
  const __m256i salt = _mm256_set1_epi32(static_cast<int>(kDigestSalt));
  const __m256i c1 = _mm256_set1_epi32(static_cast<int>(0x85ebca6bu));
  const __m256i c2 = _mm256_set1_epi32(static_cast<int>(0xc2b2ae35u));
  // Weights 2i + 1 of lanes 0-3 and 4-7; each step adds 16.
  __m256i w_lo = _mm256_set_epi64x(2 * (first + 3) + 1, 2 * (first + 2) + 1, 2 * (first + 1) + 1,
                                   2 * first + 1);
  __m256i w_hi = _mm256_add_epi64(w_lo, _mm256_set1_epi64x(8));
  const __m256i step = _mm256_set1_epi64x(16);
  __m256i acc = _mm256_setzero_si256();
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
    __m256i x = _mm256_add_epi32(_mm256_cvtepu16_epi32(raw), salt);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, c1);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
    x = _mm256_mullo_epi32(x, c2);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    const __m256i x_lo = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(x));
    const __m256i x_hi = _mm256_cvtepu32_epi64(_mm256_extracti128_si256(x, 1));
    // x * w mod 2^64 = x * w.low32 + (x * w.high32) << 32
    acc = _mm256_add_epi64(acc, _mm256_mul_epu32(x_lo, w_lo));
    acc = _mm256_add_epi64(acc, _mm256_slli_epi64(_mm256_mul_epu32(x_lo, _mm256_srli_epi64(w_lo, 32)), 32));
    acc = _mm256_add_epi64(acc, _mm256_mul_epu32(x_hi, w_hi));
    acc = _mm256_add_epi64(acc, _mm256_slli_epi64(_mm256_mul_epu32(x_hi, _mm256_srli_epi64(w_hi, 32)), 32));
    w_lo = _mm256_add_epi64(w_lo, step);
    w_hi = _mm256_add_epi64(w_hi, step);
  }
  uint64_t lanes[4];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), acc);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + DigestScalar(p + 2 * i, n - i, first + i);
}

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

}  // namespace

uint64_t DigestBytes(const void* data, uint64_t bytes, uint64_t shard_offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  return HaveAvx2() ? DigestAvx2(p, bytes / 2, shard_offset / 2)
                    : DigestScalar(p, bytes / 2, shard_offset / 2);
}

uint64_t DigestBytesPortable(const void* data, uint64_t bytes, uint64_t shard_offset) {
  return DigestScalar(static_cast<const uint8_t*>(data), bytes / 2, shard_offset / 2);
}

}  // namespace rlfleet::reshard

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

// The vector versions compute the same sum without a 64-bit multiply per unit. With
// f the mixed units and unit i = first + L k + j (lane j of L, step k of K):
//   sum f_i (2 i + 1) = sum_j [ (2 (first + j) + 1) F_j + 2 L (K F_j - P_j) ]  (mod 2^64)
// where F_j = sum_k f_kj (lane sums) and P_j = sum_k sum_{m<=k} f_mj (the lanes' running
// sums summed), since sum_k k f_kj = K F_j - P_j. The loop is Fmix32 in 32-bit lanes and
// two adds per lane; the weights are applied once at the end.
uint64_t Combine(const uint64_t* f, const uint64_t* prefix, int lanes, uint64_t steps, uint64_t first) {
  uint64_t sum = 0;
  for (int j = 0; j < lanes; ++j) {
    sum += (2 * (first + j) + 1) * f[j] + 2 * static_cast<uint64_t>(lanes) * (steps * f[j] - prefix[j]);
  }
  return sum;
}

// AVX2: 8 units per step. With `copy_to`, the bytes are also stored there as they are
// read (one pass over memory: the mixing hides under the copy's memory stalls).
__attribute__((target("avx2"))) uint64_t DigestAvx2(const uint8_t* p, uint64_t n, uint64_t first,
                                                    uint8_t* copy_to = nullptr) {
  const __m256i salt = _mm256_set1_epi32(static_cast<int>(kDigestSalt));
  const __m256i c1 = _mm256_set1_epi32(static_cast<int>(0x85ebca6bu));
  const __m256i c2 = _mm256_set1_epi32(static_cast<int>(0xc2b2ae35u));
  __m256i f_lo = _mm256_setzero_si256(), f_hi = _mm256_setzero_si256();  // lanes 0-3, 4-7
  __m256i p_lo = _mm256_setzero_si256(), p_hi = _mm256_setzero_si256();
  const uint64_t steps = n / 8;
  for (uint64_t k = 0; k < steps; ++k) {
    __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k));
    if (copy_to != nullptr) _mm_storeu_si128(reinterpret_cast<__m128i*>(copy_to + 16 * k), raw);
    __m256i x = _mm256_add_epi32(_mm256_cvtepu16_epi32(raw), salt);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, c1);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
    x = _mm256_mullo_epi32(x, c2);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    f_lo = _mm256_add_epi64(f_lo, _mm256_cvtepu32_epi64(_mm256_castsi256_si128(x)));
    f_hi = _mm256_add_epi64(f_hi, _mm256_cvtepu32_epi64(_mm256_extracti128_si256(x, 1)));
    p_lo = _mm256_add_epi64(p_lo, f_lo);
    p_hi = _mm256_add_epi64(p_hi, f_hi);
  }
  uint64_t f[8], prefix[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(f), f_lo);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(f + 4), f_hi);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(prefix), p_lo);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(prefix + 4), p_hi);
  if (copy_to != nullptr) std::memcpy(copy_to + 16 * steps, p + 16 * steps, 2 * (n - 8 * steps));
  // (the tail's digest from the copy too: what is digested is what was copied)
  const uint8_t* tail = copy_to != nullptr ? copy_to + 16 * steps : p + 16 * steps;
  return Combine(f, prefix, 8, steps, first) + DigestScalar(tail, n - 8 * steps, first + 8 * steps);
}

// AVX-512: 16 units per step. Not instrumented by ASan: g++ 12's ASan build faults
// inside this function's 512-bit stores to its own stack arrays (a read of a
// nonsense address at the store, seen in every caller under --config=asan); the
// scalar and AVX2 kernels, which compute the same digest, stay instrumented.
__attribute__((target("avx512f,avx512bw"), no_sanitize("address"))) uint64_t DigestAvx512(const uint8_t* p, uint64_t n,
                                                                                          uint64_t first,
                                                                                          uint8_t* copy_to = nullptr) {
  const __m512i salt = _mm512_set1_epi32(static_cast<int>(kDigestSalt));
  const __m512i c1 = _mm512_set1_epi32(static_cast<int>(0x85ebca6bu));
  const __m512i c2 = _mm512_set1_epi32(static_cast<int>(0xc2b2ae35u));
  __m512i f_lo = _mm512_setzero_si512(), f_hi = _mm512_setzero_si512();  // lanes 0-7, 8-15
  __m512i p_lo = _mm512_setzero_si512(), p_hi = _mm512_setzero_si512();
  const uint64_t steps = n / 16;
  for (uint64_t k = 0; k < steps; ++k) {
    __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * k));
    if (copy_to != nullptr) _mm256_storeu_si256(reinterpret_cast<__m256i*>(copy_to + 32 * k), raw);
    __m512i x = _mm512_add_epi32(_mm512_cvtepu16_epi32(raw), salt);
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, c1);
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 13));
    x = _mm512_mullo_epi32(x, c2);
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    f_lo = _mm512_add_epi64(f_lo, _mm512_cvtepu32_epi64(_mm512_castsi512_si256(x)));
    f_hi = _mm512_add_epi64(f_hi, _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(x, 1)));
    p_lo = _mm512_add_epi64(p_lo, f_lo);
    p_hi = _mm512_add_epi64(p_hi, f_hi);
  }
  uint64_t f[16], prefix[16];
  _mm512_storeu_si512(f, f_lo);
  _mm512_storeu_si512(f + 8, f_hi);
  _mm512_storeu_si512(prefix, p_lo);
  _mm512_storeu_si512(prefix + 8, p_hi);
  if (copy_to != nullptr) std::memcpy(copy_to + 32 * steps, p + 32 * steps, 2 * (n - 16 * steps));
  return Combine(f, prefix, 16, steps, first) +
         DigestScalar(copy_to != nullptr ? copy_to + 32 * steps : p + 32 * steps, n - 16 * steps, first + 16 * steps);
}

bool HaveAvx512() {
  static const bool have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return have;
}

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

}  // namespace

uint64_t DigestBytes(const void* data, uint64_t bytes, uint64_t shard_offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (HaveAvx512()) return DigestAvx512(p, bytes / 2, shard_offset / 2);
  if (HaveAvx2()) return DigestAvx2(p, bytes / 2, shard_offset / 2);
  return DigestScalar(p, bytes / 2, shard_offset / 2);
}

uint64_t CopyAndDigest(void* dst, const void* src, uint64_t bytes, uint64_t shard_offset) {
  const auto* p = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (HaveAvx512()) return DigestAvx512(p, bytes / 2, shard_offset / 2, d);
  if (HaveAvx2()) return DigestAvx2(p, bytes / 2, shard_offset / 2, d);
  std::memcpy(d, p, bytes);
  return DigestScalar(d, bytes / 2, shard_offset / 2);  // (the copy: `src` may change meanwhile)
}

uint64_t CopyAndDigestUsing(DigestImpl impl, void* dst, const void* src, uint64_t bytes, uint64_t shard_offset) {
  const auto* p = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (impl == DigestImpl::kAvx512 && HaveAvx512()) return DigestAvx512(p, bytes / 2, shard_offset / 2, d);
  if (impl == DigestImpl::kAvx2 && HaveAvx2()) return DigestAvx2(p, bytes / 2, shard_offset / 2, d);
  std::memcpy(d, p, bytes);
  return DigestScalar(d, bytes / 2, shard_offset / 2);
}

uint64_t DigestBytesUsing(DigestImpl impl, const void* data, uint64_t bytes, uint64_t shard_offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (impl == DigestImpl::kAvx512 && HaveAvx512()) return DigestAvx512(p, bytes / 2, shard_offset / 2);
  if (impl == DigestImpl::kAvx2 && HaveAvx2()) return DigestAvx2(p, bytes / 2, shard_offset / 2);
  return DigestScalar(p, bytes / 2, shard_offset / 2);
}

uint64_t DigestBytesPortable(const void* data, uint64_t bytes, uint64_t shard_offset) {
  return DigestScalar(static_cast<const uint8_t*>(data), bytes / 2, shard_offset / 2);
}

}  // namespace rlfleet::reshard

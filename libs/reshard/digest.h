// The shard digest: additive and position-aware, so that the ranks that each send a
// part of a destination shard can compute their share of its digest, and the
// destination checks the sum against what it received.
//
//   digest(shard) = sum over the 2-byte units u_i of the shard's tensor bytes of
//                   Fmix32(u_i + kDigestSalt) * (2 i + 1)   (mod 2^64; i = the unit's index)
//
// Fmix32 is MurmurHash3's 32-bit finaliser, a bijection, and 2i + 1 is odd (invertible
// mod 2^64), so any single changed unit always changes the digest, and so does swapping
// two different units; other errors escape with probability ~2^-64. It is an integrity
// check against bugs and torn transfers, not a cryptographic hash. The host looks
// Fmix32 up in a 64 Ki-entry table; the CUDA kernel computes it (two 32-bit multiplies
// per unit, cheap next to the copy it checks). Every dtype the planner knows is a whole
// number of units and parts start at even offsets.
#ifndef RLFLEET_LIBS_RESHARD_DIGEST_H_
#define RLFLEET_LIBS_RESHARD_DIGEST_H_

#include <cstdint>

#ifdef __CUDACC__
#define RLFLEET_HOST_DEVICE __host__ __device__
#else
#define RLFLEET_HOST_DEVICE
#endif

namespace rlfleet::reshard {

RLFLEET_HOST_DEVICE inline uint32_t DigestFmix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  x ^= x >> 16;
  return x;
}

constexpr uint32_t kDigestSalt = 0x5bd1e995u;

// The digest share of `bytes` (even) bytes at `data`, which sit at byte offset
// `shard_offset` (even) of their shard.
// Uses AVX-512 or AVX2 where the CPU has them.
uint64_t DigestBytes(const void* data, uint64_t bytes, uint64_t shard_offset);
// One implementation by name, for tests and benchmarks: the portable one where the CPU
// lacks the instructions.
enum class DigestImpl { kPortable, kAvx2, kAvx512 };
uint64_t DigestBytesUsing(DigestImpl impl, const void* data, uint64_t bytes, uint64_t shard_offset);
// Copies `bytes` (even) bytes from `src` to `dst` (not overlapping) and returns their
// digest share, as DigestBytes(dst, ...), in one pass over memory: each value is read
// from `src` once, so what is digested is what was written, even if another process
// stores into `src` meanwhile.
uint64_t CopyAndDigest(void* dst, const void* src, uint64_t bytes, uint64_t shard_offset);
uint64_t CopyAndDigestUsing(DigestImpl impl, void* dst, const void* src, uint64_t bytes, uint64_t shard_offset);
// The portable scalar version (tests compare the two).
uint64_t DigestBytesPortable(const void* data, uint64_t bytes, uint64_t shard_offset);

}  // namespace rlfleet::reshard

#endif  // RLFLEET_LIBS_RESHARD_DIGEST_H_

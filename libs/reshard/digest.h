// The shard digest: additive and position-aware, so that the ranks that each send a
// part of a destination shard can compute their share of its digest, and the
// destination checks the sum against what it received.
//
//   digest(shard) = sum over the 2-byte units u_i of the shard's tensor bytes of
//                   Mix(u_i + kDigestSalt) * (2 i + 1)   (mod 2^64; i = the unit's index)
//
// Mix is splitmix64's finaliser, a bijection, and 2i + 1 is odd (invertible mod 2^64),
// so any single changed unit always changes the digest, and so does swapping two
// different units; other errors escape with probability ~2^-64. It is an integrity
// check against bugs and torn transfers, not a cryptographic hash. The host version
// looks Mix up in a 64 Ki-entry table (~1 unit per cycle); the CUDA kernel computes it.
// Every dtype the planner knows is a whole number of units and parts start at even
// offsets.
#ifndef RLFLEET_LIBS_RESHARD_DIGEST_H_
#define RLFLEET_LIBS_RESHARD_DIGEST_H_

#include <cstdint>

#ifdef __CUDACC__
#define RLFLEET_HOST_DEVICE __host__ __device__
#else
#define RLFLEET_HOST_DEVICE
#endif

namespace rlfleet::reshard {

RLFLEET_HOST_DEVICE inline uint64_t DigestMix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

constexpr uint64_t kDigestSalt = 0x5bd1e9955bd1e995ull;

// The digest share of `bytes` (even) bytes at `data`, which sit at byte offset
// `shard_offset` (even) of their shard.
uint64_t DigestBytes(const void* data, uint64_t bytes, uint64_t shard_offset);

}  // namespace rlfleet::reshard

#endif  // RLFLEET_LIBS_RESHARD_DIGEST_H_

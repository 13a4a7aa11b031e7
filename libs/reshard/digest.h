// The shard digest: additive and position-aware, so that the ranks that each send a
// part of a destination shard can compute their share of its digest, and the
// destination checks the sum against what it received.
//
//   digest(shard) = sum over 2-byte units u_i of the shard's tensor bytes of
//                   Mix((i << 16) | u_i)   (mod 2^64; i = the unit's index in the shard)
//
// Mix is splitmix64's finaliser. A changed, missing or misplaced unit changes the sum
// except with probability ~2^-64 per error; it is an integrity check against bugs and
// torn transfers, not a cryptographic hash. Every dtype the planner knows is a whole
// number of units, and parts start at even offsets.
#ifndef RLFLEET_LIBS_RESHARD_DIGEST_H_
#define RLFLEET_LIBS_RESHARD_DIGEST_H_

#include <cstdint>
#include <cstring>

namespace rlfleet::reshard {

inline uint64_t DigestMix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// The digest share of `bytes` (even) bytes at `data`, which sit at byte offset
// `shard_offset` (even) of their shard.
inline uint64_t DigestBytes(const void* data, uint64_t bytes, uint64_t shard_offset) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint64_t first = shard_offset / 2;
  uint64_t sum = 0;
  for (uint64_t i = 0; i < bytes / 2; ++i) {
    uint16_t u;
    std::memcpy(&u, p + 2 * i, 2);
    sum += DigestMix(((first + i) << 16) | u);
  }
  return sum;
}

}  // namespace rlfleet::reshard

#endif  // RLFLEET_LIBS_RESHARD_DIGEST_H_

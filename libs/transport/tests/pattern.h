// Deterministic byte patterns for transport tests: byte i of pattern `seed` (counted
// from `pattern_offset`) is a fixed function of (seed, pattern_offset + i), so either
// side of a transfer can fill or verify any range byte for byte.
#ifndef RLFLEET_LIBS_TRANSPORT_TESTS_PATTERN_H_
#define RLFLEET_LIBS_TRANSPORT_TESTS_PATTERN_H_

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rlfleet::transport::testing {

inline uint64_t PatternWord(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint8_t PatternByte(uint64_t seed, uint64_t position) {
  return static_cast<uint8_t>(PatternWord(seed, position / 8) >> (8 * (position % 8)));
}

inline void FillPattern(uint8_t* data, uint64_t length, uint64_t seed, uint64_t pattern_offset) {
  uint64_t i = 0;
  for (; i < length && (pattern_offset + i) % 8 != 0; ++i) {
    data[i] = PatternByte(seed, pattern_offset + i);
  }
  for (; i + 8 <= length; i += 8) {
    const uint64_t w = PatternWord(seed, (pattern_offset + i) / 8);
    std::memcpy(data + i, &w, 8);  // little-endian: byte k is w >> 8k
  }
  for (; i < length; ++i) data[i] = PatternByte(seed, pattern_offset + i);
}

// OK if data matches; DATA_LOSS naming the first mismatching byte otherwise.
inline absl::Status VerifyPattern(const uint8_t* data, uint64_t length, uint64_t seed, uint64_t pattern_offset) {
  uint64_t i = 0;
  for (; i < length && (pattern_offset + i) % 8 != 0; ++i) {
    if (data[i] != PatternByte(seed, pattern_offset + i)) break;
  }
  if (i == length || (pattern_offset + i) % 8 == 0) {
    for (; i + 8 <= length; i += 8) {
      const uint64_t w = PatternWord(seed, (pattern_offset + i) / 8);
      if (std::memcmp(data + i, &w, 8) != 0) break;
    }
  }
  for (; i < length; ++i) {
    if (data[i] != PatternByte(seed, pattern_offset + i)) {
      return absl::DataLossError(absl::StrCat("byte ", i, " of ", length, " is ", int{data[i]}, ", expected ",
                                              int{PatternByte(seed, pattern_offset + i)}));
    }
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::transport::testing

#endif  // RLFLEET_LIBS_TRANSPORT_TESTS_PATTERN_H_

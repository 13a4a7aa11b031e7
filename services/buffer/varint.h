// Varints (protobuf's / LevelDB's base-128 encoding), for the buffer's own framing of
// stored records and its walk over serialized experiences.
#ifndef RLFLEET_SERVICES_BUFFER_VARINT_H_
#define RLFLEET_SERVICES_BUFFER_VARINT_H_

#include <cstdint>
#include <string>

namespace rlfleet::buffer {

inline void PutVarint32(std::string* out, uint32_t n) {
  while (n >= 0x80) {
    out->push_back(static_cast<char>(n | 0x80));
    n >>= 7;
  }
  out->push_back(static_cast<char>(n));
}

// The varint at *p (at most 10 bytes, before `end`), *p moved past it; false if it is
// cut off or longer.
inline bool ReadVarint(const uint8_t** p, const uint8_t* end, uint64_t* value) {
  uint64_t v = 0;
  for (int i = 0; i < 10 && *p < end; ++i) {
    const uint8_t b = *(*p)++;
    v |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if ((b & 0x80) == 0) {
      *value = v;
      return true;
    }
  }
  return false;
}

}  // namespace rlfleet::buffer

#endif  // RLFLEET_SERVICES_BUFFER_VARINT_H_

// Host conversions used by the executor and its tests.
#ifndef RLFLEET_LIBS_RESHARD_CAST_H_
#define RLFLEET_LIBS_RESHARD_CAST_H_

#include <cstdint>
#include <cstring>

namespace rlfleet::reshard {

// f32 -> bf16 with round-to-nearest-even; NaN stays a (quiet) NaN. Matches PyTorch's
// tensor.to(torch.bfloat16) on CPU and CUDA.
inline uint16_t F32ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Casts `count` f32 values at `src` (any alignment) to bf16 at `dst`.
inline void CastF32ToBf16(void* dst, const void* src, uint64_t count) {
  const uint8_t* in = static_cast<const uint8_t*>(src);
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (uint64_t i = 0; i < count; ++i) {
    float f;
    std::memcpy(&f, in + 4 * i, 4);
    const uint16_t h = F32ToBf16(f);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

}  // namespace rlfleet::reshard

#endif  // RLFLEET_LIBS_RESHARD_CAST_H_

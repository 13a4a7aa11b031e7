// Test helpers: deterministic tensor contents and the shard buffers a layout gives.
#ifndef RLFLEET_LIBS_RESHARD_TESTS_SHARDS_H_
#define RLFLEET_LIBS_RESHARD_TESTS_SHARDS_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "libs/reshard/cast.h"
#include "libs/reshard/plan.h"

namespace rlfleet::reshard::testing {

// Element `index` of tensor `tensor`, as `size` bytes. f32 tensors get finite floats
// (so that casting is meaningful); others get hashed bytes.
inline void ElementBytes(int tensor, uint64_t index, DType dtype, uint8_t* out) {
  uint64_t x = (static_cast<uint64_t>(tensor) << 40) ^ (index * 0x9e3779b97f4a7c15ull);
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  if (dtype == DType::kF32) {
    const float f = static_cast<float>(static_cast<int64_t>(x % 2000001) - 1000000) / 997.0f;
    std::memcpy(out, &f, 4);
    return;
  }
  std::memcpy(out, &x, DTypeSize(dtype));
}

// The shard buffer of `rank` in a plan's source (src = true) or destination layout,
// filled with what it should hold (padding zero). Destination f32 -> bf16 parts hold
// the cast values.
inline std::vector<uint8_t> ExpectedShard(const Plan& plan, bool src, int rank) {
  const Layout& layout = src ? plan.src : plan.dst;
  const auto& parts = src ? plan.src_parts[rank] : plan.dst_parts[rank];
  std::vector<uint8_t> buf(src ? plan.src_shard_bytes[rank] : plan.dst_shard_bytes[rank], 0);
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const TensorSpec& spec = plan.tensors[t];
    const uint32_t size = DTypeSize(parts[t].dtype);
    const bool cast = parts[t].dtype != spec.dtype;
    for (const Interval& iv : PartIntervals(spec, layout.splits[t], layout.ranks, rank)) {
      for (uint64_t k = 0; k < iv.count; ++k) {
        uint8_t element[8];
        ElementBytes(static_cast<int>(t), iv.global + k, spec.dtype, element);
        uint8_t* out = buf.data() + parts[t].offset + (iv.local + k) * size;
        if (cast) {
          CastF32ToBf16(out, element, 1);
        } else {
          std::memcpy(out, element, size);
        }
      }
    }
  }
  return buf;
}

}  // namespace rlfleet::reshard::testing

#endif  // RLFLEET_LIBS_RESHARD_TESTS_SHARDS_H_

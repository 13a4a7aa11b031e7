// CUDA kernels of the resharding executor, behind plain launch functions (this header
// includes no CUDA header). Each enqueues on `stream` (a cudaStream_t) and returns a
// cudaError_t as int (0 = success).
#ifndef RLFLEET_LIBS_RESHARD_CUDA_KERNELS_H_
#define RLFLEET_LIBS_RESHARD_CUDA_KERNELS_H_

#include <cstdint>

namespace rlfleet::reshard::cuda {

// dst[i] = bf16(src[i]) with round-to-nearest-even (as reshard::F32ToBf16).
int LaunchCastF32ToBf16(void* dst, const void* src, uint64_t count, void* stream);
// *accumulator += the digest share of [data, +bytes) at shard offset `shard_offset`
// (libs/reshard/digest.h).
int LaunchDigest(uint64_t* accumulator, const void* data, uint64_t bytes, uint64_t shard_offset, void* stream);
// Fills `count` elements of `elem_size` bytes (2, 4 or 8) with the test pattern of
// tensor `tensor`, elements [first, first + count) (tests/bench: PatternBytes).
int LaunchFillPattern(void* dst, uint64_t count, uint32_t elem_size, uint32_t tensor, uint64_t first, void* stream);
// *mismatches += the number of bytes where a and b differ.
int LaunchCountMismatches(uint64_t* mismatches, const void* a, const void* b, uint64_t bytes, void* stream);

}  // namespace rlfleet::reshard::cuda

#endif  // RLFLEET_LIBS_RESHARD_CUDA_KERNELS_H_

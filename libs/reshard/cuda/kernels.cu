#include <cuda_runtime.h>

#include "libs/reshard/cuda/kernels.h"
#include "libs/reshard/digest.h"

namespace rlfleet::reshard::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(uint64_t n) {
  const uint64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 4096 ? (b == 0 ? 1 : b) : 4096);
}

__device__ uint16_t F32ToBf16(float value) {
  const uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

__global__ void CastKernel(uint16_t* dst, const float* src, uint64_t count) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    dst[i] = F32ToBf16(src[i]);
  }
}

__device__ uint64_t SplitMix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

__device__ uint64_t WarpSum(uint64_t v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

__device__ uint64_t Term(uint32_t unit, uint64_t index) {
  return static_cast<uint64_t>(DigestFmix32(unit + kDigestSalt)) * (2 * index + 1);
}

// Units [0, n) at `units` (16-byte aligned when `vector`), unit 0 at shard index `first`.
__global__ void DigestKernel(uint64_t* acc, const uint16_t* units, uint64_t n, uint64_t first, bool vector) {
  uint64_t sum = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  uint64_t tail = 0;
  if (vector) {
    const uint64_t n8 = n / 8;
    const uint4* v = reinterpret_cast<const uint4*>(units);
    for (uint64_t j = tid; j < n8; j += stride) {
      const uint4 w = v[j];
      const uint64_t i = first + 8 * j;
      sum += Term(w.x & 0xffff, i) + Term(w.x >> 16, i + 1) + Term(w.y & 0xffff, i + 2) + Term(w.y >> 16, i + 3) +
             Term(w.z & 0xffff, i + 4) + Term(w.z >> 16, i + 5) + Term(w.w & 0xffff, i + 6) + Term(w.w >> 16, i + 7);
    }
    tail = n8 * 8;
  }
  for (uint64_t i = tail + tid; i < n; i += stride) sum += Term(units[i], first + i);
  sum = WarpSum(sum);
  if ((threadIdx.x & 31) == 0) atomicAdd(reinterpret_cast<unsigned long long*>(acc), sum);
}

__device__ uint64_t PatternWord(uint32_t tensor, uint64_t index) {
  return SplitMix((static_cast<uint64_t>(tensor) << 40) ^ (index * 0x9e3779b97f4a7c15ull));
}

__global__ void FillKernel(uint8_t* dst, uint64_t count, uint32_t elem, uint32_t tensor, uint64_t first) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t w = PatternWord(tensor, first + i);
    if (elem == 2)
      reinterpret_cast<uint16_t*>(dst)[i] = static_cast<uint16_t>(w);
    else if (elem == 4)
      reinterpret_cast<uint32_t*>(dst)[i] = static_cast<uint32_t>(w);
    else
      reinterpret_cast<uint64_t*>(dst)[i] = w;
  }
}

__global__ void MismatchKernel(uint64_t* out, const uint8_t* a, const uint8_t* b, uint64_t n) {
  uint64_t bad = 0;
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    bad += a[i] != b[i];
  }
  bad = WarpSum(bad);
  if ((threadIdx.x & 31) == 0 && bad != 0) atomicAdd(reinterpret_cast<unsigned long long*>(out), bad);
}

}  // namespace

int LaunchCastF32ToBf16(void* dst, const void* src, uint64_t count, void* stream) {
  CastKernel<<<Blocks(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<uint16_t*>(dst),
                                                                                static_cast<const float*>(src), count);
  return static_cast<int>(cudaGetLastError());
}

int LaunchDigest(uint64_t* accumulator, const void* data, uint64_t bytes, uint64_t shard_offset, void* stream) {
  const uint64_t n = bytes / 2;
  const bool vector = reinterpret_cast<uintptr_t>(data) % 16 == 0;
  DigestKernel<<<Blocks(vector ? n / 8 + 1 : n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      accumulator, static_cast<const uint16_t*>(data), n, shard_offset / 2, vector);
  return static_cast<int>(cudaGetLastError());
}

int LaunchFillPattern(void* dst, uint64_t count, uint32_t elem_size, uint32_t tensor, uint64_t first, void* stream) {
  FillKernel<<<Blocks(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<uint8_t*>(dst), count,
                                                                                elem_size, tensor, first);
  return static_cast<int>(cudaGetLastError());
}

int LaunchCountMismatches(uint64_t* mismatches, const void* a, const void* b, uint64_t bytes, void* stream) {
  MismatchKernel<<<Blocks(bytes), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      mismatches, static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), bytes);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace rlfleet::reshard::cuda

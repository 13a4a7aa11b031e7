// What the GPU copy benchmarks (gpu_install, ipc_copy_probe) share: weight-like bytes to
// copy, and a device-to-device cudaMemcpy timed with CUDA events.
#ifndef RLFLEET_BENCH_CUDA_COPY_H_
#define RLFLEET_BENCH_CUDA_COPY_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench/cuda_check.h"

namespace rlfleet::bench {

// Weight-like bytes: float32 uniform in +-0.05, every mantissa bit random (what a weight
// image holds; a constant pattern may copy faster than real weights). `bytes` / 4 floats.
inline std::vector<float> RandomWeights(uint64_t bytes) {
  std::vector<float> v(bytes / sizeof(float));
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (float& f : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    f = static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 * 0.1 - 0.05);
  }
  return v;
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// cudaMemcpyAsync device-to-device of `bytes` from `src` to `dst` on the legacy default
// stream, timed with CUDA events: microseconds, the median of `repeats` after two
// warm-ups.
inline double TimedCopyMicros(void* dst, const void* src, uint64_t bytes, int repeats) {
  cudaEvent_t start, stop;
  CUDA_OR_DIE(cudaEventCreate(&start));
  CUDA_OR_DIE(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int i = 0; i < repeats + 2; ++i) {
    CUDA_OR_DIE(cudaEventRecord(start));
    CUDA_OR_DIE(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
    CUDA_OR_DIE(cudaEventRecord(stop));
    CUDA_OR_DIE(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_OR_DIE(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 2) us.push_back(ms * 1000.0);
  }
  CUDA_OR_DIE(cudaEventDestroy(start));
  CUDA_OR_DIE(cudaEventDestroy(stop));
  return Median(us);
}

}  // namespace rlfleet::bench

#endif  // RLFLEET_BENCH_CUDA_COPY_H_

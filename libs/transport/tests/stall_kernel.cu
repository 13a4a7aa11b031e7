#include <cuda_runtime.h>

#include "libs/transport/tests/stall_kernel.h"

namespace {

__global__ void Stall(volatile int* flag) {
  // ~60 s cap so that a failing test never leaves the GPU busy for long.
  for (long long i = 0; i < 600000000LL && *flag == 0; ++i) __nanosleep(100);
}

}  // namespace

extern "C" int RlfleetLaunchStall(void* stream, volatile int* flag) {
  int* device_flag = nullptr;
  if (cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flag), const_cast<int*>(flag), 0) != cudaSuccess) {
    return -1;
  }
  Stall<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(device_flag);
  return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

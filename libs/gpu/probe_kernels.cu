// A tiny CUDA + NCCL probe: proves that nvcc (sm_90 + PTX) compiles and links in the
// Bazel build and, on a GPU machine, that kernels and NCCL run.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "libs/gpu/probe_kernels.h"

namespace {

__global__ void AddKernel(const float* a, const float* b, float* c, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

}  // namespace

#define PROBE_CUDA(call)                                                                                        \
  do {                                                                                                          \
    cudaError_t e_ = (call);                                                                                    \
    if (e_ != cudaSuccess) {                                                                                    \
      snprintf(error, error_bytes, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
      return -1;                                                                                                \
    }                                                                                                           \
  } while (0)

#define PROBE_NCCL(call)                                                                                        \
  do {                                                                                                          \
    ncclResult_t r_ = (call);                                                                                   \
    if (r_ != ncclSuccess) {                                                                                    \
      snprintf(error, error_bytes, "%s failed: %s (%s:%d)", #call, ncclGetErrorString(r_), __FILE__, __LINE__); \
      return -1;                                                                                                \
    }                                                                                                           \
  } while (0)

extern "C" int RlfleetGpuProbe(RlfleetGpuProbeResult* out, int run_device_checks, char* error, int error_bytes) {
  memset(out, 0, sizeof(*out));
  PROBE_CUDA(cudaRuntimeGetVersion(&out->cuda_runtime_version));
  cudaDriverGetVersion(&out->cuda_driver_version);  // 0 without a driver: not an error
  PROBE_NCCL(ncclGetVersion(&out->nccl_version));
  if (cudaGetDeviceCount(&out->device_count) != cudaSuccess) out->device_count = 0;
  if (out->device_count == 0) return 0;

  cudaDeviceProp prop;
  PROBE_CUDA(cudaGetDeviceProperties(&prop, 0));
  snprintf(out->device_name, sizeof(out->device_name), "%s", prop.name);
  out->sm_major = prop.major;
  out->sm_minor = prop.minor;
  out->total_memory_bytes = static_cast<long long>(prop.totalGlobalMem);
  if (!run_device_checks) return 0;

  const int n = 1 << 20;
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 0.5f * static_cast<float>(i);
  }
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  PROBE_CUDA(cudaSetDevice(0));
  PROBE_CUDA(cudaMalloc(&da, n * sizeof(float)));
  PROBE_CUDA(cudaMalloc(&db, n * sizeof(float)));
  PROBE_CUDA(cudaMalloc(&dc, n * sizeof(float)));
  PROBE_CUDA(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  PROBE_CUDA(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  AddKernel<<<(n + 255) / 256, 256>>>(da, db, dc, n);
  PROBE_CUDA(cudaGetLastError());
  PROBE_CUDA(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
  out->kernel_checked = 1;
  for (int i = 0; i < n; ++i) {
    if (c[i] != 1.5f * static_cast<float>(i)) {
      out->kernel_checked = 0;
      break;
    }
  }

  // One-rank NCCL communicator: all-reduce (sum) of the kernel's output onto itself.
  ncclComm_t comm;
  int devices[1] = {0};
  PROBE_NCCL(ncclCommInitAll(&comm, 1, devices));
  cudaStream_t stream;
  PROBE_CUDA(cudaStreamCreate(&stream));
  PROBE_NCCL(ncclAllReduce(dc, da, n, ncclFloat, ncclSum, comm, stream));
  PROBE_CUDA(cudaStreamSynchronize(stream));
  PROBE_CUDA(cudaMemcpy(a.data(), da, n * sizeof(float), cudaMemcpyDeviceToHost));
  out->nccl_checked = 1;
  for (int i = 0; i < n; ++i) {
    if (a[i] != c[i]) {
      out->nccl_checked = 0;
      break;
    }
  }
  ncclCommDestroy(comm);
  cudaStreamDestroy(stream);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  return 0;
}

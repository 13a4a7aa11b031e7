// C interface of probe_kernels.cu (compiled by nvcc, so it includes no absl or gRPC).
#ifndef RLFLEET_LIBS_GPU_PROBE_KERNELS_H_
#define RLFLEET_LIBS_GPU_PROBE_KERNELS_H_

#ifdef __cplusplus
extern "C" {
#endif

typedef struct RlfleetGpuProbeResult {
  int cuda_runtime_version;  // e.g. 13000
  int cuda_driver_version;   // 0 when no driver is loaded
  int device_count;
  int nccl_version;       // e.g. 22809
  char device_name[256];  // device 0
  int sm_major;
  int sm_minor;
  long long total_memory_bytes;
  int kernel_checked;  // 1 if a vector-add kernel ran on device 0 and was correct
  int nccl_checked;    // 1 if a 1-rank NCCL all-reduce ran and was correct
} RlfleetGpuProbeResult;

// Fills `out`. Runs a kernel and a 1-rank NCCL all-reduce on device 0 when
// `run_device_checks` is non-zero and a device exists. Returns 0 on success; otherwise
// writes a message (with the failing call and file:line) into `error` and returns -1.
int RlfleetGpuProbe(RlfleetGpuProbeResult* out, int run_device_checks, char* error, int error_bytes);

#ifdef __cplusplus
}
#endif

#endif  // RLFLEET_LIBS_GPU_PROBE_KERNELS_H_

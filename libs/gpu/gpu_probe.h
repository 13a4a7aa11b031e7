// What GPU stack this process sees: CUDA runtime / driver versions, NCCL version,
// devices, and (optionally) whether a kernel and a 1-rank NCCL all-reduce really run.
// Used by `rlfleet doctor` and by the gpu-tagged tests.
#ifndef RLFLEET_LIBS_GPU_GPU_PROBE_H_
#define RLFLEET_LIBS_GPU_GPU_PROBE_H_

#include <string>

#include "absl/status/statusor.h"

namespace rlfleet::gpu {

struct GpuInfo {
  int cuda_runtime_version = 0;
  int cuda_driver_version = 0;  // 0: no driver on this machine
  int nccl_version = 0;
  int device_count = 0;
  std::string device_name;     // device 0
  int compute_capability = 0;  // e.g. 90 for sm_90
  int64_t total_memory_bytes = 0;
  bool kernel_checked = false;
  bool nccl_checked = false;

  std::string ToString() const;
};

// Probes the stack. With `run_device_checks`, also runs a vector-add kernel and a 1-rank
// NCCL all-reduce on device 0 and verifies their results. INTERNAL naming the failing
// CUDA / NCCL call (file:line) on error; a machine without a GPU is not an error
// (device_count == 0).
absl::StatusOr<GpuInfo> ProbeGpu(bool run_device_checks);

}  // namespace rlfleet::gpu

#endif  // RLFLEET_LIBS_GPU_GPU_PROBE_H_

#include "libs/gpu/gpu_probe.h"

#include "absl/strings/str_format.h"
#include "libs/gpu/probe_kernels.h"

namespace rlfleet::gpu {

std::string GpuInfo::ToString() const {
  return absl::StrFormat("cuda runtime %d.%d, driver %d.%d, nccl %d, %d device(s)%s%s%s", cuda_runtime_version / 1000,
                         (cuda_runtime_version % 1000) / 10, cuda_driver_version / 1000,
                         (cuda_driver_version % 1000) / 10, nccl_version, device_count,
                         device_count > 0 ? absl::StrFormat(", device 0: %s sm_%d %.1f GiB", device_name,
                                                            compute_capability, total_memory_bytes / 1073741824.0)
                                          : "",
                         kernel_checked ? ", kernel ok" : "", nccl_checked ? ", nccl all-reduce ok" : "");
}

absl::StatusOr<GpuInfo> ProbeGpu(bool run_device_checks) {
  RlfleetGpuProbeResult r;
  char error[512] = {0};
  if (RlfleetGpuProbe(&r, run_device_checks ? 1 : 0, error, sizeof(error)) != 0) {
    return absl::InternalError(error);
  }
  GpuInfo info;
  info.cuda_runtime_version = r.cuda_runtime_version;
  info.cuda_driver_version = r.cuda_driver_version;
  info.nccl_version = r.nccl_version;
  info.device_count = r.device_count;
  info.device_name = r.device_name;
  info.compute_capability = r.sm_major * 10 + r.sm_minor;
  info.total_memory_bytes = r.total_memory_bytes;
  info.kernel_checked = r.kernel_checked != 0;
  info.nccl_checked = r.nccl_checked != 0;
  return info;
}

}  // namespace rlfleet::gpu

// NVIDIA's management library (NVML), loaded at run time with dlopen: GPU utilisation
// and memory for metrics (rlfleet_gpu_*) and for `rlfleet doctor`'s memory-headroom
// check. Nothing links against libnvidia-ml: on a machine without the driver every call
// here says so (UNAVAILABLE) and AddGpuMetrics adds nothing. The only file that knows
// NVML's C interface is nvml.cc.
#ifndef RLFLEET_LIBS_GPU_NVML_H_
#define RLFLEET_LIBS_GPU_NVML_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/metrics/metrics.h"

namespace rlfleet::gpu {

struct GpuSample {
  int index = 0;
  std::string name;           // e.g. "NVIDIA H200"
  double utilization = 0;     // busy fraction over NVML's last sample period, 0..1
  uint64_t memory_used = 0;   // bytes
  uint64_t memory_total = 0;  // bytes
};

// Every GPU's sample now. UNAVAILABLE (saying why: no libnvidia-ml.so.1, nvmlInit
// failed) on a machine without an NVIDIA driver; INTERNAL naming the NVML call that
// failed otherwise.
absl::StatusOr<std::vector<GpuSample>> SampleGpus();

// Per GPU, gauges read at every scrape: rlfleet_gpu_utilization_ratio,
// rlfleet_gpu_memory_used_bytes, rlfleet_gpu_memory_total_bytes (label gpu="<index>").
// Returns how many GPUs it added (0 without NVML).
int AddGpuMetrics(metrics::Registry& registry);

}  // namespace rlfleet::gpu

#endif  // RLFLEET_LIBS_GPU_NVML_H_

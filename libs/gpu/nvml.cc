#include "libs/gpu/nvml.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace rlfleet::gpu {
namespace {

// The part of NVML's C interface used here (nvml.h, stable since NVML 4).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;     // percent of the sample period a kernel ran
  unsigned int memory;  // percent of it memory was read or written
};
struct nvmlMemory_t {
  unsigned long long total, free, used;  // bytes
};
constexpr nvmlReturn_t kNvmlSuccess = 0;

struct Nvml {
  absl::Status status;  // why NVML is not usable
  nvmlReturn_t (*device_count)(unsigned int*) = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;

  std::string Error(const char* call, nvmlReturn_t r) const {
    return absl::StrCat(call, ": ", error_string != nullptr ? error_string(r) : "error", " (", r, ")");
  }
};

// Loaded and initialised once per process (and left loaded: NVML's handles live until
// exit).
const Nvml& Library() {
  static const Nvml* nvml = [] {
    auto* n = new Nvml;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      n->status =
          absl::UnavailableError(absl::StrCat("no NVIDIA driver (cannot load libnvidia-ml.so.1: ", dlerror(), ")"));
      return n;
    }
    auto init = reinterpret_cast<nvmlReturn_t (*)()>(dlsym(lib, "nvmlInit_v2"));
    n->device_count = reinterpret_cast<decltype(n->device_count)>(dlsym(lib, "nvmlDeviceGetCount_v2"));
    n->handle_by_index = reinterpret_cast<decltype(n->handle_by_index)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    n->utilization = reinterpret_cast<decltype(n->utilization)>(dlsym(lib, "nvmlDeviceGetUtilizationRates"));
    n->memory = reinterpret_cast<decltype(n->memory)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    n->name = reinterpret_cast<decltype(n->name)>(dlsym(lib, "nvmlDeviceGetName"));
    n->error_string = reinterpret_cast<decltype(n->error_string)>(dlsym(lib, "nvmlErrorString"));
    if (init == nullptr || n->device_count == nullptr || n->handle_by_index == nullptr || n->utilization == nullptr ||
        n->memory == nullptr || n->name == nullptr) {
      n->status = absl::UnavailableError("libnvidia-ml.so.1 lacks the NVML calls used here");
      return n;
    }
    if (nvmlReturn_t r = init(); r != kNvmlSuccess) n->status = absl::UnavailableError(n->Error("nvmlInit_v2", r));
    return n;
  }();
  return *nvml;
}

absl::StatusOr<GpuSample> SampleOne(const Nvml& n, unsigned int index) {
  nvmlDevice_t device = nullptr;
  if (nvmlReturn_t r = n.handle_by_index(index, &device); r != kNvmlSuccess) {
    return absl::InternalError(n.Error("nvmlDeviceGetHandleByIndex_v2", r));
  }
  GpuSample s;
  s.index = static_cast<int>(index);
  char name[96] = {0};
  if (n.name(device, name, sizeof(name)) == kNvmlSuccess) s.name = name;
  nvmlMemory_t memory{};
  if (nvmlReturn_t r = n.memory(device, &memory); r != kNvmlSuccess) {
    return absl::InternalError(n.Error("nvmlDeviceGetMemoryInfo", r));
  }
  s.memory_used = memory.used;
  s.memory_total = memory.total;
  nvmlUtilization_t utilization{};
  // Some virtualised GPUs do not report utilisation (NOT_SUPPORTED): keep 0 then.
  if (n.utilization(device, &utilization) == kNvmlSuccess) s.utilization = utilization.gpu / 100.0;
  return s;
}

}  // namespace

absl::StatusOr<std::vector<GpuSample>> SampleGpus() {
  const Nvml& n = Library();
  if (!n.status.ok()) return n.status;
  unsigned int count = 0;
  if (nvmlReturn_t r = n.device_count(&count); r != kNvmlSuccess) {
    return absl::InternalError(n.Error("nvmlDeviceGetCount_v2", r));
  }
  std::vector<GpuSample> out;
  for (unsigned int i = 0; i < count; ++i) {
    absl::StatusOr<GpuSample> s = SampleOne(n, i);
    if (!s.ok()) return s.status();
    out.push_back(*s);
  }
  return out;
}

int AddGpuMetrics(metrics::Registry& registry) {
  absl::StatusOr<std::vector<GpuSample>> gpus = SampleGpus();
  if (!gpus.ok()) return 0;
  for (const GpuSample& g : *gpus) {
    const metrics::Labels labels = {{"gpu", std::to_string(g.index)}};
    auto read = [index = g.index](auto field) {
      return [index, field]() -> double {
        absl::StatusOr<GpuSample> s = SampleOne(Library(), index);
        return s.ok() ? field(*s) : 0.0;
      };
    };
    registry.AddCallbackGauge("rlfleet_gpu_utilization_ratio", "Fraction of NVML's sample period a kernel ran.", labels,
                              read([](const GpuSample& s) { return s.utilization; }));
    registry.AddCallbackGauge("rlfleet_gpu_memory_used_bytes", "GPU memory in use (all processes).", labels,
                              read([](const GpuSample& s) { return static_cast<double>(s.memory_used); }));
    registry.AddCallbackGauge("rlfleet_gpu_memory_total_bytes", "GPU memory.", labels,
                              read([](const GpuSample& s) { return static_cast<double>(s.memory_total); }));
  }
  return static_cast<int>(gpus->size());
}

}  // namespace rlfleet::gpu

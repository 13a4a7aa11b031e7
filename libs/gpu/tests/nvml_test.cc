// NVML through dlopen. Built twice: nvml_cpu_test (this machine, no driver: a clear
// UNAVAILABLE and no metrics) and nvml_test with RLFLEET_EXPECT_GPU (tag gpu, run on
// the GPU machine: every GPU sampled, gauges rendered).
#include "libs/gpu/nvml.h"

#include <iostream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace rlfleet::gpu {
namespace {

#ifndef RLFLEET_EXPECT_GPU
TEST(Nvml, WithoutADriverSamplingSaysWhyAndNoGaugesAreAdded) {
  auto gpus = SampleGpus();
  ASSERT_FALSE(gpus.ok());
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(gpus.status().message(), "libnvidia-ml.so.1")) << gpus.status();
  metrics::Registry registry;
  EXPECT_EQ(AddGpuMetrics(registry), 0);
  EXPECT_FALSE(absl::StrContains(registry.Render(), "rlfleet_gpu_"));
}
#else
TEST(Nvml, EveryGpuIsSampledAndExported) {
  auto gpus = SampleGpus();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_GE(gpus->size(), 1u);
  for (const GpuSample& g : *gpus) {
    EXPECT_FALSE(g.name.empty());
    EXPECT_GT(g.memory_total, 1ull << 30) << g.name;
    EXPECT_LE(g.memory_used, g.memory_total);
    EXPECT_GE(g.utilization, 0.0);
    EXPECT_LE(g.utilization, 1.0);
  }
  metrics::Registry registry;
  EXPECT_EQ(AddGpuMetrics(registry), static_cast<int>(gpus->size()));
  const std::string text = registry.Render();
  EXPECT_TRUE(absl::StrContains(text, "rlfleet_gpu_memory_total_bytes{gpu=\"0\"}")) << text;
  EXPECT_TRUE(absl::StrContains(text, "rlfleet_gpu_utilization_ratio{gpu=\"0\"}")) << text;
  std::cout << "GPU 0: " << (*gpus)[0].name << ", " << (*gpus)[0].memory_used << " of " << (*gpus)[0].memory_total
            << " bytes used, utilization " << (*gpus)[0].utilization << std::endl;
}
#endif

}  // namespace
}  // namespace rlfleet::gpu

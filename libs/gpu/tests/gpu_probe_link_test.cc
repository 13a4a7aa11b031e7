// Runs on CPU machines: the nvcc-built object links, and the CUDA runtime and NCCL
// libraries load and report their versions even without a GPU or driver.
#include "gtest/gtest.h"
#include "libs/gpu/gpu_probe.h"

namespace rlfleet::gpu {
namespace {

TEST(GpuProbeLink, ReportsVersionsWithoutRunningDeviceChecks) {
  auto info = ProbeGpu(/*run_device_checks=*/false);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GE(info->cuda_runtime_version, 12000);
  EXPECT_GE(info->nccl_version, 22000);
  EXPECT_FALSE(info->kernel_checked);
  EXPECT_FALSE(info->nccl_checked);
  EXPECT_FALSE(info->ToString().empty());
}

}  // namespace
}  // namespace rlfleet::gpu

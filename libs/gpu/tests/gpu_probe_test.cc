#include "libs/gpu/gpu_probe.h"

#include <iostream>

#include "gtest/gtest.h"

namespace rlfleet::gpu {
namespace {

TEST(GpuProbe, KernelAndOneRankNcclAllReduceRunOnDevice0) {
  auto info = ProbeGpu(/*run_device_checks=*/true);
  ASSERT_TRUE(info.ok()) << info.status();
  std::cout << info->ToString() << "\n";
  ASSERT_GE(info->device_count, 1);
  EXPECT_GE(info->compute_capability, 90) << "built for sm_90 (+PTX)";
  EXPECT_GE(info->cuda_driver_version, 13000);
  EXPECT_GE(info->nccl_version, 22000);
  EXPECT_TRUE(info->kernel_checked);
  EXPECT_TRUE(info->nccl_checked);
}

}  // namespace
}  // namespace rlfleet::gpu

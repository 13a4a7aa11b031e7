// The CUDA MemoryOps agree with the host definitions (tag "gpu"): digest shares at
// arbitrary even offsets, the f32 -> bf16 cast including NaN, infinities, denormals
// and ties, and device copies.
#include "libs/reshard/cuda/cuda_memory_ops.h"

#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "libs/reshard/cast.h"
#include "libs/reshard/digest.h"

namespace rlfleet::reshard {
namespace {

TEST(CudaMemoryOpsTest, DigestCastAndCopyMatchTheHost) {
  auto ops = NewCudaMemoryOps(0);
  ASSERT_TRUE(ops.ok()) << ops.status();
  std::mt19937_64 rng(5);
  const uint64_t n = (1 << 22) + 6;  // bytes
  std::vector<uint8_t> host(n);
  for (auto& b : host) b = static_cast<uint8_t>(rng());
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, n), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), n, cudaMemcpyHostToDevice), cudaSuccess);

  (*ops)->ResetDigests(3);
  (*ops)->AddDigest(0, dev, n, 0);
  (*ops)->AddDigest(1, static_cast<uint8_t*>(dev) + 2, n - 2, 1000002);
  (*ops)->AddDigest(2, dev, 2, 6);
  auto sums = (*ops)->Digests();
  ASSERT_TRUE(sums.ok()) << sums.status();
  EXPECT_EQ((*sums)[0], DigestBytes(host.data(), n, 0));
  EXPECT_EQ((*sums)[1], DigestBytes(host.data() + 2, n - 2, 1000002));
  EXPECT_EQ((*sums)[2], DigestBytes(host.data(), 2, 6));

  std::vector<float> f = {0.0f,
                          -0.0f,
                          1.0f,
                          1.00390625f,
                          1.01171875f,
                          3.4e38f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(),
                          1e-40f};
  for (int i = 0; i < 100000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    float v;
    std::memcpy(&v, &bits, 4);
    f.push_back(v);
  }
  void* df = nullptr;
  void* dh = nullptr;
  ASSERT_EQ(cudaMalloc(&df, f.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dh, f.size() * 2), cudaSuccess);
  cudaMemcpy(df, f.data(), f.size() * 4, cudaMemcpyHostToDevice);
  (*ops)->CastF32ToBf16(dh, df, f.size());
  ASSERT_TRUE((*ops)->Sync().ok());
  std::vector<uint16_t> got(f.size()), want(f.size());
  cudaMemcpy(got.data(), dh, f.size() * 2, cudaMemcpyDeviceToHost);
  CastF32ToBf16(want.data(), f.data(), f.size());
  EXPECT_EQ(got, want);

  void* copy = nullptr;
  ASSERT_EQ(cudaMalloc(&copy, n), cudaSuccess);
  (*ops)->Copy(copy, dev, n);
  ASSERT_TRUE((*ops)->Sync().ok());
  std::vector<uint8_t> back(n);
  cudaMemcpy(back.data(), copy, n, cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, host);
  cudaFree(dev);
  cudaFree(df);
  cudaFree(dh);
  cudaFree(copy);
}

}  // namespace
}  // namespace rlfleet::reshard

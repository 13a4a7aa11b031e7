// Runs on CPU machines too: the NCCL backend links, validates its options before it
// touches a device, and reports a missing GPU as a clear error.
#include <cuda_runtime.h>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/transport/nccl/nccl_transport.h"

namespace rlfleet::transport {
namespace {

TEST(NcclTransportCpu, BadOptionsAreInvalidArgument) {
  NcclOptions options;
  options.unique_id = std::string(128, 'x');
  options.world_size = 2;
  options.rank = 2;
  EXPECT_EQ(NcclTransport::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.rank = 0;
  options.unique_id = "short";
  auto s = NcclTransport::Create(options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "unique_id")) << s;
}

TEST(NcclTransportCpu, NoGpuIsFailedPrecondition) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
    GTEST_SKIP() << "this machine has a GPU; nccl_transport_test covers it";
  }
  NcclOptions options;
  options.unique_id = std::string(128, '\0');
  auto s = NcclTransport::Create(options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "no CUDA device")) << s;
}

}  // namespace
}  // namespace rlfleet::transport

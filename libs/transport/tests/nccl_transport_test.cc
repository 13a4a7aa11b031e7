// The NCCL backend on one GPU (tag "gpu"): communicator lifecycle, a 1-rank broadcast,
// grouped send/recv to self, and the abort paths (a rank that never joins; an
// operation that can never complete) ending in errors within their deadlines.
#include "libs/transport/nccl/nccl_transport.h"

#include <cuda_runtime.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/metrics/metrics.h"
#include "libs/transport/tests/pattern.h"
#include "libs/transport/tests/stall_kernel.h"

namespace rlfleet::transport {
namespace {

using testing::FillPattern;
using testing::VerifyPattern;

std::unique_ptr<NcclTransport> OneRank(absl::Duration op_timeout = absl::Seconds(30)) {
  auto id = NcclTransport::NewUniqueId();
  EXPECT_TRUE(id.ok()) << id.status();
  NcclOptions options;
  options.unique_id = *id;
  options.op_timeout = op_timeout;
  auto t = NcclTransport::Create(options);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// Copies `n` bytes of pattern `seed` to device memory `h`.
void Upload(const MemoryHandle& h, uint64_t n, uint64_t seed) {
  std::vector<uint8_t> host(n);
  FillPattern(host.data(), n, seed, 0);
  ASSERT_EQ(cudaMemcpy(h.base, host.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
}

absl::Status Check(const MemoryHandle& h, uint64_t n, uint64_t seed) {
  std::vector<uint8_t> host(n);
  if (cudaMemcpy(host.data(), h.base, n, cudaMemcpyDeviceToHost) != cudaSuccess) {
    return absl::InternalError("cudaMemcpy");
  }
  return VerifyPattern(host.data(), n, seed, 0);
}

// The line of the process's /metrics text that starts with `series` ("" if none).
std::string MetricLine(const std::string& series) {
  for (absl::string_view line : absl::StrSplit(metrics::Global().Render(), '\n')) {
    if (absl::StartsWith(line, series + " ")) return std::string(line);
  }
  return "";
}

TEST(NcclTransport, CommunicatorLifecycleAndCapabilities) {
  for (int i = 0; i < 3; ++i) {  // create and destroy repeatedly: no leak, no hang
    auto t = OneRank();
    ASSERT_NE(t, nullptr);
    Capabilities caps = t->GetCapabilities();
    EXPECT_EQ(caps.backend, "nccl");
    EXPECT_TRUE(caps.cuda_memory);
    EXPECT_FALSE(caps.one_sided);
    EXPECT_EQ(t->LocalAddress(), "nccl:0");
    EXPECT_EQ(*t->Connect("nccl:0"), 1u);
    EXPECT_EQ(t->Connect("nccl:1").status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(NcclTransport, OneRankBroadcastIsByteExact) {
  auto t = OneRank();
  ASSERT_NE(t, nullptr);
  constexpr uint64_t kSize = (64 << 20) + 3;
  auto src = t->AllocateMemory(kSize, MemoryKind::kCuda, 0);
  auto dst = t->AllocateMemory(kSize, MemoryKind::kCuda, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  Upload(*src, kSize, 11);
  const std::string bytes_before = MetricLine("rlfleet_nccl_bytes_total{op=\"broadcast\"}");
  auto done = t->Broadcast(0, *src, 0, *dst, 0, kSize);
  ASSERT_TRUE(done->Wait(absl::Seconds(30)).ok());
  EXPECT_EQ(done->bytes(), kSize);
  EXPECT_TRUE(Check(*dst, kSize, 11).ok());
  // The collective's time and bytes are in the process's metrics.
  EXPECT_TRUE(bytes_before.empty() || bytes_before != MetricLine("rlfleet_nccl_bytes_total{op=\"broadcast\"}"));
  EXPECT_TRUE(absl::StrContains(metrics::Global().Render(), "rlfleet_nccl_op_seconds_count{op=\"broadcast\"} "));
  EXPECT_FALSE(MetricLine("rlfleet_nccl_bytes_total{op=\"broadcast\"}").empty());
  EXPECT_TRUE(t->DeregisterMemory(*src).ok());
  EXPECT_TRUE(t->DeregisterMemory(*dst).ok());
}

TEST(NcclTransport, GroupedSendRecvToSelfIsByteExact) {
  auto t = OneRank();
  ASSERT_NE(t, nullptr);
  constexpr uint64_t kSize = 16 << 20;
  auto src = t->AllocateMemory(kSize, MemoryKind::kCuda, 0);
  auto dst = t->AllocateMemory(kSize, MemoryKind::kCuda, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  Upload(*src, kSize, 12);
  const PeerId self = *t->Connect("nccl:0");
  auto done = t->Grouped({{true, self, *src, 0, kSize}, {false, self, *dst, 0, kSize}});
  ASSERT_TRUE(done->Wait(absl::Seconds(30)).ok());
  EXPECT_TRUE(Check(*dst, kSize, 12).ok());
}

TEST(NcclTransport, BadInputIsAClearError) {
  auto t = OneRank();
  ASSERT_NE(t, nullptr);
  std::vector<uint8_t> host(16);
  EXPECT_EQ(t->RegisterMemory(host.data(), 16, MemoryKind::kHost, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto buf = t->AllocateMemory(1024, MemoryKind::kCuda, 0);
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ(t->Send(5, 0, *buf, 0, 16)->Wait(absl::Seconds(1)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t->Send(1, 0, *buf, 1000, 100)->Wait(absl::Seconds(1)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(t->Put(1, *buf, 0, {}, 0, 16)->Wait(absl::Seconds(1)).code(), absl::StatusCode::kUnimplemented);
  ASSERT_TRUE(t->DeregisterMemory(*buf).ok());
  EXPECT_EQ(t->Send(1, 0, *buf, 0, 16)->Wait(absl::Seconds(1)).code(), absl::StatusCode::kNotFound);
}

TEST(NcclTransport, RankThatNeverJoinsIsDeadlineExceededNotAHang) {
  auto id = NcclTransport::NewUniqueId();
  ASSERT_TRUE(id.ok());
  NcclOptions options;
  options.unique_id = *id;
  options.world_size = 2;  // rank 1 never comes
  options.init_timeout = absl::Seconds(3);
  const absl::Time start = absl::Now();
  auto t = NcclTransport::Create(options);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

TEST(NcclTransport, OperationThatCannotFinishAbortsTheCommunicator) {
  // The stream is held by a spinning kernel until the test releases it, so NCCL work
  // queued behind it cannot finish: what a dead peer rank looks like to the watchdog.
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  int* flag = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&flag), sizeof(int), cudaHostAllocMapped), cudaSuccess);
  *flag = 0;
  ASSERT_EQ(RlfleetLaunchStall(stream, flag), 0);
  auto id = NcclTransport::NewUniqueId();
  ASSERT_TRUE(id.ok());
  NcclOptions options;
  options.unique_id = *id;
  options.op_timeout = absl::Seconds(2);
  options.cuda_stream = stream;
  auto t = NcclTransport::Create(options);
  ASSERT_TRUE(t.ok()) << t.status();
  auto src = (*t)->AllocateMemory(1 << 20, MemoryKind::kCuda, 0);
  auto dst = (*t)->AllocateMemory(1 << 20, MemoryKind::kCuda, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  auto stuck = (*t)->Grouped({{true, 1, *src, 0, 1 << 20}, {false, 1, *dst, 0, 1 << 20}});
  const absl::Time start = absl::Now();
  absl::Status s = stuck->Wait(absl::Seconds(20));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "aborted")) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_FALSE(MetricLine("rlfleet_nccl_errors_total{op=\"send_recv\"}").empty());
  // Later operations fail at once.
  EXPECT_EQ((*t)->Send(1, 0, *src, 0, 16)->Wait(absl::Seconds(1)).code(), absl::StatusCode::kUnavailable);
  *reinterpret_cast<volatile int*>(flag) = 1;
  t->reset();
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  cudaFreeHost(flag);
}

}  // namespace
}  // namespace rlfleet::transport

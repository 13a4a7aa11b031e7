// The NCCL backend across GPUs of one host, one process per GPU (tag "gpu"; skipped
// with fewer than two GPUs): byte-exact send/recv both ways for 1 MiB .. 256 MiB,
// broadcast, and a rank killed mid-operation, which the survivor sees as UNAVAILABLE
// (communicator aborted) within the deadline, never a hang.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/transport/nccl/nccl_transport.h"
#include "libs/transport/tests/pattern.h"

namespace rlfleet::transport {
namespace {

using testing::FillPattern;
using testing::VerifyPattern;

// Child-process checks: print what failed and return non-zero.
#define CHILD_CHECK(cond, what)                                  \
  do {                                                           \
    if (!(cond)) {                                               \
      std::cerr << "rank " << rank << ": " << what << std::endl; \
      return 1;                                                  \
    }                                                            \
  } while (0)

int GpuCount() {
  // Counted in a child so that the parent never initialises CUDA before fork().
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(n);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

std::unique_ptr<NcclTransport> Join(const std::string& id, int rank, absl::Duration op_timeout) {
  NcclOptions options;
  options.unique_id = id;
  options.world_size = 2;
  options.rank = rank;
  options.device = rank;
  options.op_timeout = op_timeout;
  auto t = NcclTransport::Create(options);
  if (!t.ok()) {
    std::cerr << "rank " << rank << ": " << t.status() << std::endl;
    return nullptr;
  }
  return std::move(*t);
}

int TransfersChild(const std::string& id, int rank) {
  auto t = Join(id, rank, absl::Seconds(60));
  CHILD_CHECK(t != nullptr, "join failed");
  const PeerId other = *t->Connect(absl::StrCat("nccl:", 1 - rank));
  constexpr uint64_t kMax = 256ull << 20;
  auto buf = t->AllocateMemory(kMax, MemoryKind::kCuda, rank);
  CHILD_CHECK(buf.ok(), buf.status());
  std::vector<uint8_t> host(kMax);
  for (uint64_t size = 1 << 20; size <= kMax; size *= 4) {
    for (int sender = 0; sender < 2; ++sender) {
      const uint64_t seed = size + sender;
      if (rank == sender) {
        FillPattern(host.data(), size, seed, 0);
        cudaMemcpy(buf->base, host.data(), size, cudaMemcpyHostToDevice);
        absl::Status s = t->Send(other, 0, *buf, 0, size)->Wait(absl::Seconds(60));
        CHILD_CHECK(s.ok(), "send " << size << ": " << s);
      } else {
        cudaMemset(buf->base, 0, size);
        absl::Status s = t->Recv(other, 0, *buf, 0, size)->Wait(absl::Seconds(60));
        CHILD_CHECK(s.ok(), "recv " << size << ": " << s);
        cudaMemcpy(host.data(), buf->base, size, cudaMemcpyDeviceToHost);
        absl::Status v = VerifyPattern(host.data(), size, seed, 0);
        CHILD_CHECK(v.ok(), "content of " << size << " bytes from rank " << sender << ": " << v);
      }
    }
  }
  // Broadcast 64 MiB + 3 from rank 0.
  const uint64_t n = (64ull << 20) + 3;
  if (rank == 0) {
    FillPattern(host.data(), n, 77, 0);
    cudaMemcpy(buf->base, host.data(), n, cudaMemcpyHostToDevice);
  } else {
    cudaMemset(buf->base, 0, n);
  }
  absl::Status b = t->Broadcast(0, *buf, 0, *buf, 0, n)->Wait(absl::Seconds(60));
  CHILD_CHECK(b.ok(), "broadcast: " << b);
  cudaMemcpy(host.data(), buf->base, n, cudaMemcpyDeviceToHost);
  absl::Status v = VerifyPattern(host.data(), n, 77, 0);
  CHILD_CHECK(v.ok(), "broadcast content: " << v);
  std::cout << "rank " << rank << ": transfers ok" << std::endl;
  return 0;
}

int KilledPeerChild(const std::string& id, int rank) {
  auto t = Join(id, rank, /*op_timeout=*/absl::Seconds(5));
  CHILD_CHECK(t != nullptr, "join failed");
  auto buf = t->AllocateMemory(64 << 20, MemoryKind::kCuda, rank);
  CHILD_CHECK(buf.ok(), buf.status());
  const PeerId other = *t->Connect(absl::StrCat("nccl:", 1 - rank));
  // Warm up the connection, so that the kill lands mid-operation, not in setup.
  if (rank == 0) {
    CHILD_CHECK(t->Send(other, 0, *buf, 0, 1 << 20)->Wait(absl::Seconds(60)).ok(), "warm-up send");
  } else {
    CHILD_CHECK(t->Recv(other, 0, *buf, 0, 1 << 20)->Wait(absl::Seconds(60)).ok(), "warm-up recv");
    std::cout << "rank 1: dying now" << std::endl;
    _exit(0);  // dies without a word to rank 0
  }
  const absl::Time start = absl::Now();
  absl::Status s = t->Recv(other, 0, *buf, 0, 64 << 20)->Wait(absl::Seconds(30));
  const absl::Duration took = absl::Now() - start;
  CHILD_CHECK(absl::IsUnavailable(s), "expected UNAVAILABLE from a dead rank, got " << s);
  CHILD_CHECK(absl::StrContains(s.message(), "aborted"), "not aborted: " << s);
  CHILD_CHECK(took < absl::Seconds(20), "took " << took);
  std::cout << "rank 0: dead peer -> " << s << " after " << took << std::endl;
  return 0;
}

// Runs `child(id, rank)` in two processes, one per GPU; returns their exit codes.
std::vector<int> RunPair(int (*child)(const std::string&, int)) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);      // NVLink multicast stays off on shared hosts
  auto id = NcclTransport::NewUniqueId();  // the bootstrap root lives in this process
  EXPECT_TRUE(id.ok()) << id.status();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    pid_t pid = fork();
    if (pid == 0) _exit(child(*id, rank));
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(240);
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

TEST(NcclMultiGpu, SendRecvBothWaysAndBroadcastAreByteExact) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs two GPUs";
  std::vector<int> codes = RunPair(&TransfersChild);
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(NcclMultiGpu, KilledRankIsUnavailableWithinTheDeadline) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs two GPUs";
  std::vector<int> codes = RunPair(&KilledPeerChild);
  EXPECT_EQ(codes[0], 0) << "the surviving rank must see an error in time";
}

}  // namespace
}  // namespace rlfleet::transport

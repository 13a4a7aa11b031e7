// rlfleet doctor's checks against fake environments and sysfs trees.
#include "services/controller/doctor.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/registry/registrar.h"

namespace rlfleet::controller {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

TEST(Doctor, FlagsNcclVariablesThatDoNothing) {
  auto results = CheckNcclVariables({{"NCCL_MIN_NCHANNELS_BEFORE_FUSION", "4"},
                                     {"NCCL_ASYNC_ERROR_HANDLING", "1"},
                                     {"NCCL_SOCKET_IFNAME", "eth0"},
                                     {"PATH", "/bin"}});
  ASSERT_EQ(results.size(), 2u);
  // map order: NCCL_ASYNC_... first
  EXPECT_EQ(results[0].status, CheckStatus::kWarn);
  EXPECT_TRUE(absl::StrContains(results[0].detail, "PyTorch")) << results[0].detail;
  EXPECT_EQ(results[1].status, CheckStatus::kFail);
  EXPECT_TRUE(absl::StrContains(results[1].detail, "NCCL_MIN_NCHANNELS_BEFORE_FUSION=4 is not an NCCL variable"));
  auto clean = CheckNcclVariables({{"NCCL_SOCKET_IFNAME", "eth0"}, {"NCCL_NVLS_ENABLE", "0"}});
  ASSERT_EQ(clean.size(), 1u);
  EXPECT_EQ(clean[0].status, CheckStatus::kPass);
  EXPECT_TRUE(absl::StrContains(clean[0].detail, "NCCL_NVLS_ENABLE=0"));
}

TEST(Doctor, DebugLoggingLeftOnIsAWarning) {
  EXPECT_EQ(CheckNcclDebug({{"NCCL_DEBUG", "info"}}).status, CheckStatus::kWarn);
  EXPECT_EQ(CheckNcclDebug({{"NCCL_DEBUG", "WARN"}, {"NCCL_DEBUG_SUBSYS", "ALL"}}).status, CheckStatus::kWarn);
  EXPECT_EQ(CheckNcclDebug({{"NCCL_DEBUG", "WARN"}}).status, CheckStatus::kPass);
  EXPECT_EQ(CheckNcclDebug({}).status, CheckStatus::kPass);
}

TEST(Doctor, NicErrorsFailDropsAndSmallMtuWarn) {
  const fs::path net = fs::path(std::getenv("TEST_TMPDIR")) / "net";
  Write(net / "lo" / "statistics" / "rx_errors", "99");  // ignored
  Write(net / "eth0" / "mtu", "9000");
  Write(net / "eth0" / "statistics" / "rx_errors", "3");
  Write(net / "eth1" / "mtu", "1500");
  Write(net / "eth1" / "statistics" / "tx_dropped", "12");
  Write(net / "eth2" / "mtu", "1280");
  Write(net / "eth3" / "mtu", "1500");
  std::map<std::string, CheckStatus> by_nic;
  for (const auto& r : CheckNics(net.string())) by_nic[r.detail.substr(0, r.detail.find(':'))] = r.status;
  EXPECT_EQ(by_nic.size(), 4u);
  EXPECT_EQ(by_nic["eth0"], CheckStatus::kFail);
  EXPECT_EQ(by_nic["eth1"], CheckStatus::kWarn);
  EXPECT_EQ(by_nic["eth2"], CheckStatus::kWarn);
  EXPECT_EQ(by_nic["eth3"], CheckStatus::kPass);
}

TEST(Doctor, GpuNumaGivesTheBindingLine) {
  const fs::path pci = fs::path(std::getenv("TEST_TMPDIR")) / "pci";
  Write(pci / "0000:18:00.0" / "vendor", "0x10de");
  Write(pci / "0000:18:00.0" / "class", "0x030200");
  Write(pci / "0000:18:00.0" / "numa_node", "1");
  Write(pci / "0000:19:00.0" / "vendor", "0x8086");  // not a GPU of ours
  Write(pci / "0000:19:00.0" / "class", "0x020000");
  auto results = CheckGpuNuma(pci.string());
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(absl::StrContains(results[0].detail, "NUMA node 1"));
  EXPECT_EQ(results[0].fix, "run its process under numactl --cpunodebind=1 --membind=1");
  EXPECT_TRUE(absl::StrContains(CheckGpuNuma("/nonexistent")[0].detail, "no NVIDIA GPU"));
}

TEST(Doctor, NcclSettingsThatDifferAcrossReplicasFail) {
  // What the registrar publishes: NCCL_* only, as env.NCCL_* labels.
  const auto labels = registry::NcclEnvLabels({{"NCCL_IB_HCA", "mlx5_0"}, {"PATH", "/bin"}, {"NCCL_ALGO", "Ring"}});
  EXPECT_EQ(labels, (std::map<std::string, std::string>{{"env.NCCL_ALGO", "Ring"}, {"env.NCCL_IB_HCA", "mlx5_0"}}));
  std::vector<ReplicaLabels> same = {{"rollout-a", labels}, {"rollout-b", labels}};
  auto ok = CheckNcclConsistency(same);
  ASSERT_EQ(ok.size(), 2u);
  for (const auto& r : ok) EXPECT_EQ(r.status, CheckStatus::kPass) << r.detail;
  std::vector<ReplicaLabels> mixed = {{"rollout-a", labels},
                                      {"rollout-b", {{"env.NCCL_IB_HCA", "mlx5_1"}, {"env.NCCL_ALGO", "Ring"}}},
                                      {"trainer-0", {{"env.NCCL_ALGO", "Ring"}}}};
  auto bad = CheckNcclConsistency(mixed);
  ASSERT_EQ(bad.size(), 2u);
  EXPECT_EQ(bad[0].check, "nccl_consistency NCCL_ALGO");
  EXPECT_EQ(bad[0].status, CheckStatus::kPass);
  EXPECT_EQ(bad[1].status, CheckStatus::kFail);
  EXPECT_TRUE(absl::StrContains(bad[1].detail, "mlx5_0 on rollout-a")) << bad[1].detail;
  EXPECT_TRUE(absl::StrContains(bad[1].detail, "mlx5_1 on rollout-b")) << bad[1].detail;
  EXPECT_TRUE(absl::StrContains(bad[1].detail, "(unset) on trainer-0")) << bad[1].detail;
  EXPECT_FALSE(bad[1].fix.empty());
  auto none = CheckNcclConsistency({{"a", {}}, {"b", {{"pool", "h200"}}}});
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].status, CheckStatus::kPass);
}

TEST(Doctor, NumaBindingAgainstEachReplicasGpu) {
  auto results = CheckNumaBinding({{"rollout-ok", {{"numa.node", "1"}, {"numa.gpu_node", "1"}}},
                                   {"rollout-off", {{"numa.node", "-1"}, {"numa.gpu_node", "0"}}},
                                   {"trainer-far", {{"numa.node", "0"}, {"numa.gpu_node", "1"}}},
                                   {"rollout-cpu", {{"numa.node", "-1"}, {"numa.gpu_node", "-1"}}},
                                   {"reward-a", {{"env.NCCL_ALGO", "Ring"}}}});
  ASSERT_EQ(results.size(), 4u);  // (the reward service registers no NUMA labels)
  EXPECT_EQ(results[0].status, CheckStatus::kPass) << results[0].detail;
  EXPECT_EQ(results[1].status, CheckStatus::kWarn) << results[1].detail;
  EXPECT_TRUE(absl::StrContains(results[1].detail, "node 0")) << results[1].detail;
  EXPECT_EQ(results[2].status, CheckStatus::kFail) << results[2].detail;
  EXPECT_EQ(results[2].check, "numa trainer-far");
  EXPECT_TRUE(absl::StrContains(results[2].fix, "--numa=1")) << results[2].fix;
  EXPECT_EQ(results[3].status, CheckStatus::kPass) << results[3].detail;
}

TEST(Doctor, ClockSkewAcrossReplicasWarnsAndFails) {
  const absl::Time sent = absl::FromUnixSeconds(1000), received = sent + absl::Milliseconds(20);
  const double mid = 1000.010;
  auto results = CheckClockSkew({{"in-sync", sent, received, mid + 0.005, ""},
                                 {"drifting", sent, received, mid + 0.4, ""},
                                 {"off", sent, received, mid - 3.0, ""},
                                 {"silent", sent, received, std::nullopt, "cannot connect"}});
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[0].status, CheckStatus::kPass) << results[0].detail;
  EXPECT_EQ(results[1].status, CheckStatus::kWarn) << results[1].detail;
  EXPECT_EQ(results[2].status, CheckStatus::kFail) << results[2].detail;
  EXPECT_TRUE(absl::StrContains(results[2].detail, "-3.000 s")) << results[2].detail;
  EXPECT_FALSE(results[2].fix.empty());
  EXPECT_EQ(results[3].status, CheckStatus::kWarn);
  EXPECT_TRUE(absl::StrContains(results[3].detail, "cannot connect"));
  // A skew inside the round trip's uncertainty is not flagged.
  auto slow = CheckClockSkew({{"far", sent, sent + absl::Seconds(4), 1000 + 2 + 1.5, ""}});
  EXPECT_EQ(slow[0].status, CheckStatus::kPass) << slow[0].detail;
}

TEST(Doctor, JsonIsOneObjectPerCheck) {
  const std::string json = FormatResults({{"nccl_env", CheckStatus::kFail, "X=\"1\"", "unset X"}}, true);
  EXPECT_EQ(json,
            "[{\"check\": \"nccl_env\", \"status\": \"fail\", \"detail\": \"X=\\\"1\\\"\", \"fix\": \"unset X\"}]\n");
}

TEST(Doctor, GpuMemoryHeadroomWarnsUnderTenPercentAndFailsUnderTwo) {
  const uint64_t gib = 1ull << 30;
  auto results = CheckGpuMemory({{0, "NVIDIA H200", 20 * gib, 140 * gib},
                                 {1, "NVIDIA H200", 130 * gib, 140 * gib},
                                 {2, "NVIDIA H200", 139 * gib, 140 * gib}});
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].status, CheckStatus::kPass);
  EXPECT_EQ(results[0].detail, "GPU 0 (NVIDIA H200): 120.0 of 140.0 GiB free (86%)");
  EXPECT_EQ(results[1].status, CheckStatus::kWarn);
  EXPECT_EQ(results[2].status, CheckStatus::kFail);
  EXPECT_TRUE(absl::StrContains(results[2].fix, "nvidia-smi")) << results[2].fix;
  // This machine has no NVIDIA driver: the local run says so and does not fail on it.
  for (const CheckResult& r : RunLocalChecks()) {
    if (r.check == "gpu_memory") {
      EXPECT_NE(r.status, CheckStatus::kFail) << r.detail;
    }
  }
}

}  // namespace
}  // namespace rlfleet::controller

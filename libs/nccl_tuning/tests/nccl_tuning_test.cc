// NCCL profiles (every variable one NCCL reads, documented, explicit settings win) and
// the NCCL_DEBUG=INFO log reader on logs recorded on an H200 machine
// (tests/testdata, by tools/device/record_nccl_logs.sh) and on a hand-written
// multi-node excerpt in NCCL's format.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/nccl_tuning/nccl_env.h"
#include "libs/nccl_tuning/nccl_log.h"

namespace rlfleet::nccl {
namespace {

std::string ReadTestData(const std::string& name) {
  std::ifstream in("libs/nccl_tuning/tests/testdata/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(NcclProfiles, EveryVariableIsOneNcclReadsAndIsDocumented) {
  ASSERT_EQ(NcclProfiles().size(), 3u);
  for (const NcclProfile& p : NcclProfiles()) {
    EXPECT_FALSE(p.scope.empty()) << p.name;
    bool nvls_off = false;
    for (const NcclSetting& s : p.settings) {
      EXPECT_TRUE(KnownNcclVariables().count(s.name)) << p.name << ": " << s.name << " is not an NCCL variable";
      EXPECT_FALSE(ForeignNcclVariables().count(s.name)) << s.name;
      EXPECT_GT(s.what.size(), 20u) << p.name << ": " << s.name << " needs a description";
      nvls_off |= s.name == "NCCL_NVLS_ENABLE" && s.value == "0";
      EXPECT_FALSE(s.name == "NCCL_DEBUG" && s.value == "INFO") << "debug logging left on in " << p.name;
    }
    EXPECT_TRUE(nvls_off) << p.name << " must keep NVLink multicast off";
  }
  // The guide's invented variable is not one NCCL reads.
  EXPECT_FALSE(KnownNcclVariables().count("NCCL_MIN_NCHANNELS_BEFORE_FUSION"));
  const std::string text = FormatNcclProfiles();
  EXPECT_TRUE(absl::StrContains(text, "# large-ib: more than 32 GPUs")) << text;
  EXPECT_TRUE(absl::StrContains(text, "export NCCL_IB_QPS_PER_CONNECTION=4  # ")) << text;
}

TEST(NcclProfiles, ApplyingKeepsWhatTheOperatorSetAndUnknownNamesAreErrors) {
  auto missing = FindNcclProfile("huge");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "single-node, multi-node, large-ib"));
  auto profile = FindNcclProfile("multi-node");
  ASSERT_TRUE(profile.ok());
  for (const NcclSetting& s : (*profile)->settings) unsetenv(s.name.c_str());
  setenv("NCCL_SOCKET_NTHREADS", "2", 1);  // the operator's choice
  const std::vector<std::string> lines = ApplyNcclProfile(**profile);
  ASSERT_EQ(lines.size(), (*profile)->settings.size());
  EXPECT_STREQ(getenv("NCCL_SOCKET_NTHREADS"), "2");
  EXPECT_STREQ(getenv("NCCL_NSOCKS_PERTHREAD"), "4");
  EXPECT_STREQ(getenv("NCCL_NET_GDR_LEVEL"), "PHB");
  EXPECT_TRUE(std::count(lines.begin(), lines.end(),
                         "kept NCCL_SOCKET_NTHREADS=2 from the environment (profile multi-node: 4)"));
  EXPECT_TRUE(std::count(lines.begin(), lines.end(), "set NCCL_NSOCKS_PERTHREAD=4"));
}

TEST(NcclLog, AHealthySingleGpuAllReduceOnTheH200) {
  const NcclLogSummary s = ParseNcclLog(ReadTestData("allreduce_1gpu.log"));
  EXPECT_EQ(s.version, "2.28.9+cuda13.0");
  EXPECT_EQ(s.ranks, 1);
  EXPECT_EQ(s.hosts, (std::set<std::string>{"vm"}));
  EXPECT_EQ(s.processes.size(), 1u);
  EXPECT_EQ(s.networks, (std::set<std::string>{"Socket"}));
  EXPECT_EQ(s.coll_channels, 64);
  EXPECT_EQ(s.nvls_channels, 0);
  EXPECT_EQ(s.p2p_channels, 64);
  EXPECT_EQ(s.rings, 64);
  EXPECT_EQ(s.trees, 64);
  EXPECT_EQ(s.init_started, 1);
  EXPECT_EQ(s.init_complete, 1);
  EXPECT_EQ(s.destroyed, 1);
  EXPECT_EQ(s.env.at("NCCL_NVLS_ENABLE"), "0");
  EXPECT_TRUE(s.warnings.empty());
  EXPECT_TRUE(s.problems.empty()) << s.problems.front();
  const std::string text = FormatNcclLogSummary(s, false);
  EXPECT_TRUE(absl::StrContains(text, "problems:    none")) << text;
  EXPECT_TRUE(absl::StrContains(FormatNcclLogSummary(s, true), "\"coll_channels\":64")) << text;
}

TEST(NcclLog, TwoRanksOnOneGpuAreReportedAsTheProblem) {
  const NcclLogSummary s = ParseNcclLog(ReadTestData("duplicate_gpu.log"));
  EXPECT_EQ(s.processes.size(), 2u);
  EXPECT_EQ(s.ranks, 2);
  EXPECT_EQ(s.init_started, 2);
  EXPECT_EQ(s.init_complete, 0);
  ASSERT_EQ(s.warnings.size(), 2u);  // one per rank
  EXPECT_TRUE(absl::StrContains(s.warnings[0], "Duplicate GPU detected")) << s.warnings[0];
  auto has = [&](absl::string_view text) {
    for (const std::string& p : s.problems) {
      if (absl::StrContains(p, text)) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("WARN Duplicate GPU detected"));
  EXPECT_TRUE(has("NCCL returned error 5 (ncclInvalidUsage)"));
  EXPECT_TRUE(has("2 communicator(s) started init and never completed it"));
  EXPECT_TRUE(has("NCCL error in:"));  // PyTorch's line about it
}

// Written by hand in NCCL's format (two 2-GPU hosts: P2P inside, IB with GPUDirect RDMA
// between, one stale socket connection, then a timeout and an abort).
// One communicator completes and is later aborted while another never finishes init:
// the hang is still reported (per communicator, not by counting).
TEST(NcclLog, AnAbortElsewhereDoesNotHideAHungInit) {
  const NcclLogSummary s = ParseNcclLog(R"(
h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0xa rank 0 nranks 2 cudaDev 0 busId 1 commId 0x1 - Init START
h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0xa rank 0 nranks 2 cudaDev 0 busId 1 commId 0x1 - Init COMPLETE
h:1:1 [0] NCCL INFO comm 0xa rank 0 nranks 2 cudaDev 0 busId 1 - Abort COMPLETE
h:2:2 [1] NCCL INFO ncclCommInitRankConfig comm 0xa rank 1 nranks 2 cudaDev 1 busId 2 commId 0x2 - Init START
)");
  EXPECT_EQ(s.init_started, 2);
  EXPECT_EQ(s.aborted, 1);
  EXPECT_NE(std::find(s.problems.begin(), s.problems.end(), "1 communicator(s) started init and never completed it"),
            s.problems.end())
      << FormatNcclLogSummary(s, false);
}

TEST(NcclLog, TransportsAcrossHostsTimeoutsAndAborts) {
  const std::string log = R"(
hostA:101:201 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
hostA:101:201 [0] NCCL INFO Using network IB
hostA:101:201 [0] NCCL INFO comm 0xa rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0
hostA:101:201 [0] NCCL INFO Channel 00/02 :    0   1   2   3
hostA:101:201 [0] NCCL INFO Channel 01/02 :    0   1   2   3
hostA:101:201 [0] NCCL INFO Trees [0] 1/2/-1->0->-1 [1] 1/-1/-1->0->2
hostA:101:301 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
hostA:102:302 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/IB/0/GDRDMA
hostB:201:401 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [receive] via NET/IB/0/GDRDMA
hostB:202:402 [1] NCCL INFO Channel 01/0 : 3[1] -> 0[0] [send] via NET/Socket/1
hostB:201:401 [0] NCCL INFO Channel 01/0 : 2[0] -> 3[1] via SHM/direct/direct
hostA:101:201 [0] NCCL INFO Connected all rings
hostA:101:201 [0] NCCL INFO Connected all trees
hostB:202:402 [1] NCCL WARN NET/IB : Got completion from peer 10.0.0.1<43210> with status=12 opcode=1 len=0 vendor err 129 (Send)
hostB:202:402 [1] NCCL INFO transport/net_ib.cc:1696 -> 6
[rank3]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.
hostB:202:402 [1] NCCL INFO comm 0xd rank 3 nranks 4 cudaDev 1 busId 1b000 - Abort COMPLETE
)";
  const NcclLogSummary s = ParseNcclLog(log);
  EXPECT_EQ(s.hosts, (std::set<std::string>{"hostA", "hostB"}));
  EXPECT_EQ(s.ranks, 4);
  EXPECT_EQ(s.nodes, 2);
  EXPECT_EQ(s.rings, 2);
  EXPECT_EQ(s.trees, 2);
  EXPECT_TRUE(s.connected_rings && s.connected_trees);
  EXPECT_EQ(s.connections, (std::map<std::string, int>{{"NET/IB", 2}, {"NET/Socket", 1}, {"P2P", 1}, {"SHM", 1}}));
  EXPECT_EQ(s.gdr_connections, 2);
  EXPECT_EQ(s.aborted, 1);
  ASSERT_EQ(s.warnings.size(), 1u);
  ASSERT_EQ(s.problems.size(), 4u) << FormatNcclLogSummary(s, false);
  EXPECT_TRUE(absl::StartsWith(s.problems[0], "WARN NET/IB : Got completion from peer"));
  EXPECT_EQ(s.problems[1], "NCCL returned error 6 (ncclRemoteError)");
  EXPECT_TRUE(absl::StrContains(s.problems[2], "Watchdog caught collective operation timeout"));
  EXPECT_EQ(s.problems[3], "1 communicator(s) aborted");
  EXPECT_TRUE(absl::StrContains(FormatNcclLogSummary(s, false),
                                "NET/IB 2, NET/Socket 1, P2P 1, SHM 1 (2 with GPUDirect RDMA)"));
}

}  // namespace
}  // namespace rlfleet::nccl

// The NCCL tooling through the real binaries: `rlfleet nccl-log` on logs recorded on an
// H200 machine (exit 1 and the problem named when there is one), `rlfleet
// nccl-profiles`, and a service applying --nccl_profile (explicit variables win; an
// unknown profile is an error at start).
#include <sys/wait.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

using testing::RunfilePath;
using testing::Subprocess;

// Runs a command to completion; returns its exit code and output.
std::pair<int, std::string> RunToEnd(const std::vector<std::string>& argv) {
  Subprocess p;
  EXPECT_TRUE(p.Start(argv).ok());
  auto done = p.Wait(absl::Seconds(60));
  EXPECT_TRUE(done.ok());
  return {done.ok() ? WEXITSTATUS(*done) : -1, p.output()};
}

TEST(NcclTools, NcclLogSummarisesRecordedLogsAndFailsOnProblems) {
  const std::string rlfleet = RunfilePath("services/controller/rlfleet");
  const std::string testdata = "libs/nccl_tuning/tests/testdata/";
  auto [healthy_rc, healthy] = RunToEnd({rlfleet, "nccl-log", RunfilePath(testdata + "allreduce_1gpu.log")});
  EXPECT_EQ(healthy_rc, 0) << healthy;
  EXPECT_TRUE(absl::StrContains(healthy, "NCCL 2.28.9+cuda13.0")) << healthy;
  EXPECT_TRUE(absl::StrContains(healthy, "64 collective, 0 NVLS, 64 p2p; 64 ring(s)")) << healthy;
  EXPECT_TRUE(absl::StrContains(healthy, "problems:    none")) << healthy;
  auto [bad_rc, bad] = RunToEnd({rlfleet, "nccl-log", "--json", RunfilePath(testdata + "duplicate_gpu.log")});
  EXPECT_EQ(bad_rc, 1) << bad;
  EXPECT_TRUE(absl::StrContains(bad, "\"init_complete\":0")) << bad;
  EXPECT_TRUE(absl::StrContains(bad, "Duplicate GPU detected")) << bad;
  auto [missing_rc, missing] = RunToEnd({rlfleet, "nccl-log", "/nonexistent.log"});
  EXPECT_NE(missing_rc, 0);
  EXPECT_TRUE(absl::StrContains(missing, "cannot read /nonexistent.log")) << missing;
  auto [profiles_rc, profiles] = RunToEnd({rlfleet, "nccl-profiles"});
  EXPECT_EQ(profiles_rc, 0);
  EXPECT_TRUE(absl::StrContains(profiles, "# single-node: one host")) << profiles;
}

TEST(NcclTools, AServiceAppliesItsProfileAtStartAndRefusesAnUnknownOne) {
  const std::string rollout = RunfilePath("services/rollout/rlfleet-rollout");
  auto [bad_rc, bad] = RunToEnd({rollout, "--port=0", "--nccl_profile=huge"});
  EXPECT_EQ(bad_rc, 2) << bad;
  EXPECT_TRUE(absl::StrContains(bad, "unknown NCCL profile 'huge'; the profiles are single-node")) << bad;
  setenv("NCCL_DEBUG", "VERSION", 1);  // the operator's setting, inherited by the child
  Subprocess p;
  ASSERT_TRUE(p.Start({rollout, "--host=127.0.0.1", "--port=0", "--nccl_profile=single-node"}).ok());
  auto listening =
      p.WaitForLine([](const std::string& l) { return absl::StrContains(l, "listening on"); }, absl::Seconds(60));
  ASSERT_TRUE(listening.ok()) << p.output();
  EXPECT_TRUE(absl::StrContains(p.output(), "NCCL profile single-node: set NCCL_IB_DISABLE=1")) << p.output();
  EXPECT_TRUE(absl::StrContains(p.output(), "NCCL profile single-node: kept NCCL_DEBUG=VERSION from the environment"))
      << p.output();
  ASSERT_TRUE(p.Signal(SIGTERM).ok());
  ASSERT_TRUE(p.Wait(absl::Seconds(30)).ok());
}

}  // namespace
}  // namespace rlfleet

// The local launcher: the whole fleet comes up (embedded Redis, every service its own
// process), `rlfleet scale rollout=N` starts and stops replicas, Ctrl-C leaves no
// process behind.
#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/util/local_fleet.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

using testing::RunfilePath;
using testing::Subprocess;

// Runs `rlfleet ARGS --controller=C` and returns its exit code and output.
std::pair<int, std::string> Cli(const std::string& controller, std::vector<std::string> args) {
  Subprocess p;
  std::vector<std::string> argv = {RunfilePath("services/controller/rlfleet")};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--controller=" + controller);
  if (!p.Start(argv).ok()) return {-1, ""};
  auto status = p.Wait(absl::Seconds(30));
  return {status.ok() ? WEXITSTATUS(*status) : -1, p.output()};
}

// Waits (deadline 90 s) until `rlfleet status` shows `registered` rollout replicas.
bool AwaitRollouts(const std::string& controller, int registered) {
  const std::string want = absl::StrCat("registered ", registered, " ");
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (absl::Now() < deadline) {
    auto [rc, out] = Cli(controller, {"status"});
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      if (absl::StrContains(line, "rollout") && absl::StrContains(line, want)) return true;
    }
  }
  return false;
}

TEST(Launcher, UpScaleUpScaleDownAndCtrlCLeavesNothing) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/fleet";
  Subprocess launcher;
  absl::StatusOr<std::string> started = testing::StartLocalFleet(&launcher, dir);
  ASSERT_TRUE(started.ok()) << started.status();
  const std::string controller = *started;
  ASSERT_TRUE(AwaitRollouts(controller, 1));
  // Every service's /metrics is in the Prometheus targets file (reward, buffer, trainer,
  // controller, the rollout replica).
  {
    std::ifstream targets(dir + "/prometheus/targets.json");
    std::string json((std::istreambuf_iterator<char>(targets)), std::istreambuf_iterator<char>());
    for (const char* service : {"reward", "buffer", "trainer", "controller", "rollout0"}) {
      EXPECT_TRUE(absl::StrContains(json, absl::StrCat("\"service\": \"", service, "\""))) << json;
    }
  }

  auto [rc_up, out_up] = Cli(controller, {"scale", "rollout=2"});
  ASSERT_EQ(rc_up, 0) << out_up;
  EXPECT_TRUE(absl::StrContains(out_up, "desired 2 (was 1)")) << out_up;
  EXPECT_TRUE(AwaitRollouts(controller, 2)) << launcher.output();
  auto [rc_down, out_down] = Cli(controller, {"scale", "rollout=1"});
  ASSERT_EQ(rc_down, 0) << out_down;
  EXPECT_TRUE(AwaitRollouts(controller, 1)) << launcher.output();
  auto [rc_bad, out_bad] = Cli(controller, {"scale", "buffer=2"});
  EXPECT_NE(rc_bad, 0);
  EXPECT_TRUE(absl::StrContains(out_bad, "not scaled")) << out_bad;

  // Ctrl-C: every process the launcher started is gone.
  ASSERT_TRUE(launcher.Signal(SIGINT).ok());
  auto exited = launcher.Wait(absl::Seconds(60));
  ASSERT_TRUE(exited.ok());
  EXPECT_EQ(WEXITSTATUS(*exited), 0) << launcher.output();
  std::set<pid_t> pids;
  const std::string out = launcher.output();
  std::regex pid_re("pid ([0-9]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), pid_re); it != std::sregex_iterator(); ++it) {
    int pid = 0;
    if (absl::SimpleAtoi((*it)[1].str(), &pid)) pids.insert(pid);
  }
  EXPECT_GE(pids.size(), 7u) << out;  // redis, reward, buffer, trainer, controller, 2 rollouts
  for (pid_t pid : pids) {
    EXPECT_TRUE(kill(pid, 0) != 0 && errno == ESRCH) << "pid " << pid << " is still running";
  }
  EXPECT_TRUE(absl::StrContains(out, "launch.sh: stopped")) << out;
}

}  // namespace
}  // namespace rlfleet

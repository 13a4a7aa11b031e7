// deploy/local/launch.sh keeps the fleet up (issue 18): a rollout replica killed -9 is
// replaced (it used to stay gone: registered 0, desired 1), and a core service that
// dies is restarted where it was instead of the launcher stopping the whole fleet.
// Ctrl-C afterwards still leaves no process behind.
#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdlib>
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

using testing::FleetLogs;
using testing::RunfilePath;
using testing::Subprocess;

// `rlfleet status --controller=C`: its output.
std::string Status(const std::string& controller) {
  Subprocess p;
  if (!p.Start({RunfilePath("services/controller/rlfleet"), "status", "--controller=" + controller}).ok()) return "";
  (void)p.Wait(absl::Seconds(30));
  return p.output();
}

// The pid the launcher printed for `name` in a line matching `pattern` (its first
// group), from `line`.
pid_t PidIn(const std::string& line, const std::string& pattern) {
  std::smatch m;
  int pid = 0;
  if (!std::regex_search(line, m, std::regex(pattern)) || !absl::SimpleAtoi(m[1].str(), &pid)) return -1;
  return pid;
}

TEST(Launcher, ReplacesAKilledRolloutReplicaAndRestartsACrashedService) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/fleet";
  Subprocess launcher;
  absl::StatusOr<std::string> started = testing::StartLocalFleet(&launcher, dir);
  ASSERT_TRUE(started.ok()) << started.status();
  const std::string controller = *started;
  const std::string out = launcher.output();
  const pid_t rollout0 = PidIn(out, "rollout0 on [0-9.:]+ \\(pid ([0-9]+)");
  const pid_t reward = PidIn(out, "reward on [0-9.:]+ \\(pid ([0-9]+)");
  std::smatch port;
  ASSERT_TRUE(std::regex_search(out, port, std::regex("reward on (127\\.0\\.0\\.1:[0-9]+)")));
  const std::string reward_address = port[1];
  ASSERT_GT(rollout0, 0) << out;
  ASSERT_GT(reward, 0) << out;

  // A rollout replica killed -9: the launcher notices and starts another.
  ASSERT_EQ(kill(rollout0, SIGKILL), 0);
  auto replaced = launcher.WaitForLine(
      [](const std::string& l) { return absl::StrContains(l, "launch.sh: rollout1 on "); }, absl::Seconds(120));
  ASSERT_TRUE(replaced.ok()) << replaced.status() << launcher.output();
  EXPECT_TRUE(
      absl::StrContains(launcher.output(), "rollout replica rollout0 (pid " + std::to_string(rollout0) + ") exited"))
      << launcher.output();

  EXPECT_TRUE(absl::StrContains(Status(controller), "SERVING")) << launcher.output();

  // A core service killed -9: restarted on its port, the fleet stays up.
  ASSERT_EQ(kill(reward, SIGKILL), 0);
  auto restarted = launcher.WaitForLine(
      [&](const std::string& l) { return absl::StrContains(l, "launch.sh: reward on " + reward_address); },
      absl::Seconds(120));
  ASSERT_TRUE(restarted.ok()) << restarted.status() << launcher.output();
  EXPECT_TRUE(absl::StrContains(launcher.output(), "reward (pid " + std::to_string(reward) + ") exited"))
      << launcher.output();
  EXPECT_FALSE(absl::StrContains(launcher.output(), "launch.sh: stopped")) << launcher.output();

  // Ctrl-C at once, while the launcher may still be recording the restarted reward:
  // every process the launcher started (the dead ones reaped) is gone. (It used to
  // leave the new reward behind when the signal came before its pid was stored.)
  ASSERT_TRUE(launcher.Signal(SIGINT).ok());
  auto exited = launcher.Wait(absl::Seconds(60));
  ASSERT_TRUE(exited.ok()) << exited.status() << "\n" << launcher.output() << FleetLogs(dir);
  EXPECT_EQ(WEXITSTATUS(*exited), 0) << launcher.output();
  std::set<pid_t> pids;
  const std::string all = launcher.output();
  std::regex pid_re("pid ([0-9]+)");
  for (auto it = std::sregex_iterator(all.begin(), all.end(), pid_re); it != std::sregex_iterator(); ++it) {
    int pid = 0;
    if (absl::SimpleAtoi((*it)[1].str(), &pid)) pids.insert(pid);
  }
  for (pid_t pid : pids) {
    EXPECT_TRUE(kill(pid, 0) != 0 && errno == ESRCH) << "pid " << pid << " is still running";
  }
}

}  // namespace
}  // namespace rlfleet

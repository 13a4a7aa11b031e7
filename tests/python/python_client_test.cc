// The Python client as a user installs and uses it: `pip install ./python` into a venv
// (offline: --no-build-isolation --no-index over Debian's grpcio, protobuf and
// setuptools through --system-site-packages; the stubs generated from proto/ at build
// time), then python/tests/fleet_check.py drives a real local fleet through it: a run,
// generation, a train step, the buffer, and errors that name the mistake; then
// python/tests/reward_check.py scores a run with a reward written in Python.
#include <cstdlib>
#include <filesystem>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/util/local_fleet.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

namespace fs = std::filesystem;

TEST(PythonClient, InstallsOfflineAndDrivesARealFleet) {
  const std::string tmp = std::getenv("TEST_TMPDIR");
  setenv("HOME", tmp.c_str(), 1);
  setenv("PIP_NO_CACHE_DIR", "1", 1);
  setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1", 1);
  // The package and the protos, copied out of the runfiles (the build writes stubs).
  const std::string src = tmp + "/src";
  fs::create_directories(src + "/proto/rlfleet");
  fs::copy(testing::RunfilePath("python"), src + "/python", fs::copy_options::recursive);
  fs::copy(testing::RunfilePath("proto/rlfleet/v1"), src + "/proto/rlfleet/v1", fs::copy_options::recursive);

  const std::string venv = tmp + "/venv";
  testing::Exited made = testing::RunToExit({"/usr/bin/python3", "-m", "venv", "--system-site-packages", venv});
  ASSERT_EQ(made.code, 0) << made.output;
  testing::Exited installed = testing::RunToExit(
      {venv + "/bin/pip", "install", "--no-build-isolation", "--no-index", src + "/python"}, absl::Seconds(300));
  ASSERT_EQ(installed.code, 0) << installed.output;
  EXPECT_TRUE(absl::StrContains(installed.output, "Successfully installed rlfleet")) << installed.output;

  testing::Subprocess launcher;
  const std::string dir = tmp + "/fleet";
  absl::StatusOr<std::string> controller = testing::StartLocalFleet(&launcher, dir);
  ASSERT_TRUE(controller.ok()) << controller.status();
  testing::Exited checked =
      testing::RunToExit({venv + "/bin/python", src + "/python/tests/fleet_check.py", *controller}, absl::Seconds(400));
  EXPECT_EQ(checked.code, 0) << checked.output << testing::FleetLogs(dir);
  EXPECT_TRUE(absl::StrContains(checked.output, "python client: all checks passed")) << checked.output;
  std::cout << checked.output;
  // A reward written in Python scores a run of the same fleet (python/rlfleet/reward_worker.py).
  testing::Exited rewarded = testing::RunToExit(
      {venv + "/bin/python", src + "/python/tests/reward_check.py", *controller, tmp + "/reward"}, absl::Seconds(400));
  EXPECT_EQ(rewarded.code, 0) << rewarded.output << testing::FleetLogs(dir);
  EXPECT_TRUE(absl::StrContains(rewarded.output, "reward worker: all checks passed")) << rewarded.output;
  std::cout << rewarded.output;
  ASSERT_TRUE(launcher.Signal(SIGTERM).ok());
  EXPECT_TRUE(launcher.Wait(absl::Seconds(60)).ok());
}

}  // namespace
}  // namespace rlfleet

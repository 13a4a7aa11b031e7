// examples/math/run_cpu.sh as a user runs it: problems written, a tiny model directory
// made, the fleet launched on it, `rlfleet run --dataset` through GRPO steps whose
// responses the reward service scores against the problems' answers; the fleet stopped.
#include <sys/wait.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

TEST(MathExample, RunsGrpoOnWordProblemsThroughTheFleet) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/math";
  testing::Subprocess example;
  ASSERT_TRUE(example
                  .Start({"/usr/bin/env", "STEPS=3", "DIR=" + dir, "RLFLEET_BIN=" + testing::RunfilePath("services"),
                          "RLFLEET_MAKE_MODEL=" + testing::RunfilePath("examples/math/make_tiny_model"), "/bin/bash",
                          testing::RunfilePath("examples/math/run_cpu.sh")})
                  .ok());
  auto status = example.Wait(absl::Seconds(280));
  ASSERT_TRUE(status.ok()) << status.status() << example.output();
  const std::string& out = example.output();
  EXPECT_EQ(WEXITSTATUS(*status), 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "300 problems")) << out;
  EXPECT_TRUE(absl::StrContains(out, "qwen2 from")) << out;
  EXPECT_TRUE(absl::StrContains(out, "RUN_STATE_COMPLETED")) << out;
  // The run's metrics: three steps, each trained (the random policy answers a few right:
  // groups with a learning signal), rewards in [0, 1].
  const size_t at = out.find("== metrics: ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string csv = out.substr(at + 12, out.find('\n', at) - at - 12);
  std::ifstream in(csv);
  std::string header, line;
  ASSERT_TRUE(std::getline(in, header)) << csv;
  int steps = 0;
  while (std::getline(in, line)) {
    std::vector<std::string> cells = absl::StrSplit(line, ',');
    ASSERT_GT(cells.size(), 5u) << line;
    const double reward = std::stod(cells[3]);
    EXPECT_GE(reward, 0.0) << line;
    EXPECT_LE(reward, 1.0) << line;
    ++steps;
  }
  EXPECT_EQ(steps, 3) << csv;
}

}  // namespace
}  // namespace rlfleet

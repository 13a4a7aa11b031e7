// A run file through the real binaries: each service takes its section and the shared
// ones (flags on the command line still win), and a mistake in the file stops a binary
// at start with the file, the line and the key.
#include <fstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

using testing::Exited;
using testing::RunfilePath;

Exited RunBinary(const std::string& binary, const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {binary};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return testing::RunToExit(argv);
}

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(RunFile, ABadKeyStopsTheBinaryNamingTheFileLineAndKey) {
  const std::string bad = Write("bad.yaml", "model:\n  d_model: 64\ntrainer:\n  precision: bf16\n  nope: 1\n");
  const Exited trainer = RunBinary("services/trainer/rlfleet-trainer", {"--config=" + bad, "--port=0"});
  EXPECT_EQ(trainer.code, 2) << trainer.output;
  EXPECT_TRUE(absl::StrContains(trainer.output, "bad.yaml:5: unknown key `trainer.nope`")) << trainer.output;

  const std::string typo = Write("typo.yaml", "trainer:\n  precision: bf16\nmodel:\n  n_layers: two\n");
  const Exited rollout = RunBinary("services/rollout/rlfleet-rollout", {"--config=" + typo, "--port=0"});
  EXPECT_EQ(rollout.code, 2) << rollout.output;
  EXPECT_TRUE(absl::StrContains(rollout.output, "typo.yaml:4: bad value `two` for `model.n_layers`")) << rollout.output;

  const std::string section = Write("section.yaml", "trainers:\n  port: 1\n");
  const Exited reward = RunBinary("services/reward/rlfleet-reward", {"--config=" + section, "--port=0"});
  EXPECT_EQ(reward.code, 2) << reward.output;
  EXPECT_TRUE(absl::StrContains(reward.output, "section.yaml:1: unknown section `trainers`")) << reward.output;
}

TEST(RunFile, TheCliReadsItsSectionsAndScriptsReadTheFleets) {
  const std::string run = Write("run.yaml",
                                "model:\n  d_model: 64\n  n_layers: 1\ndata:\n  task: reverse\nalgorithm:\n  steps: 3\n"
                                "fleet:\n  rollouts: 3\ntrainer:\n  nope: 1\n");
  const Exited value = RunBinary("services/controller/rlfleet", {"run-file", "fleet.rollouts", "--config=" + run});
  EXPECT_EQ(value.code, 0) << value.output;
  EXPECT_EQ(value.output, "3\n");
  const Exited absent = RunBinary("services/controller/rlfleet", {"run-file", "fleet.nothing", "--config=" + run});
  EXPECT_EQ(absent.code, 0) << absent.output;  // not set: empty (launch.sh keeps its default)
  EXPECT_EQ(absent.output, "\n");
  // The CLI's own sections parse against its flags: a key of algorithm it lacks is named.
  const std::string cli_bad = Write("cli.yaml", "algorithm:\n  stepz: 3\n");
  const Exited bad = RunBinary("services/controller/rlfleet", {"run-file", "fleet.rollouts", "--config=" + cli_bad});
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_TRUE(absl::StrContains(bad.output, "cli.yaml:2: unknown key `algorithm.stepz`")) << bad.output;
}

}  // namespace
}  // namespace rlfleet

// Run files: one YAML document; each binary reads its own sections and the shared ones
// as flags, every error names the file, the line and the key.
#include "libs/common/run_file.h"

#include <gtest/gtest.h>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"

ABSL_DECLARE_FLAG(int, test_port);
ABSL_DECLARE_FLAG(std::string, test_name);

namespace rlfleet::common {
namespace {

constexpr char kRun[] = R"(# a whole run
model:
  dir: /data/Qwen2.5-0.5B
data:
  dataset: /data/gsm8k.jsonl
  prompt_field: question
  chat_template_kwargs: {enable_thinking: false, "n": 2}
algorithm:
  steps: 200
  lr: 1e-5
trainer:
  precision: bf16
  port: 7004
rollout:
  dtype: bf16
fleet:
  rollouts: 2
transport:
  data_plane: ucx
nccl:
  profile: nvlink
controller:
  rollout: [127.0.0.1:7010, 127.0.0.1:7011]
)";

std::string Describe(const std::vector<ConfigEntry>& entries) {
  std::string out;
  for (const auto& e : entries) {
    out += e.source + ">" + e.key + "=" + e.value + "@" + std::to_string(e.line) + (e.optional ? "?" : "") + ";";
  }
  return out;
}

TEST(RunFile, EachBinaryReadsItsSectionsAndTheSharedOnes) {
  auto trainer = ParseRunFile(kRun, "run.yaml", "rlfleet-trainer");
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ(Describe(*trainer),
            "model.dir>model_dir=/data/Qwen2.5-0.5B@3?;trainer.precision>precision=bf16@12;trainer.port>port=7004@13;"
            "transport.data_plane>data_plane=ucx@19?;nccl.profile>nccl_profile=nvlink@21?;");
  auto cli = ParseRunFile(kRun, "run.yaml", "rlfleet");
  ASSERT_TRUE(cli.ok()) << cli.status();
  EXPECT_EQ(Describe(*cli),
            "model.dir>model_dir=/data/Qwen2.5-0.5B@3?;data.dataset>dataset=/data/gsm8k.jsonl@5;"
            "data.prompt_field>prompt_field=question@6;"
            "data.chat_template_kwargs>chat_template_kwargs={\"enable_thinking\":false,\"n\":2}@7;"
            "algorithm.steps>steps=200@9;algorithm.lr>lr=1e-5@10;transport.data_plane>data_plane=ucx@19?;"
            "nccl.profile>nccl_profile=nvlink@21?;");
  auto controller = ParseRunFile(kRun, "run.yaml", "rlfleet-controller");
  ASSERT_TRUE(controller.ok());
  EXPECT_TRUE(absl::StrContains(Describe(*controller), "controller.rollout>rollout=127.0.0.1:7010,127.0.0.1:7011@23;"))
      << Describe(*controller);
  auto rollouts = RunFileValue(kRun, "run.yaml", "fleet.rollouts");
  ASSERT_TRUE(rollouts.ok()) << rollouts.status();
  EXPECT_EQ(*rollouts, "2");
  EXPECT_TRUE(absl::IsNotFound(RunFileValue(kRun, "run.yaml", "fleet.redis").status()));
  EXPECT_TRUE(IsRunFile("a/run.yaml") && IsRunFile("r.yml") && !IsRunFile("c.conf"));
}

TEST(RunFile, ErrorsNameTheLineAndTheKey) {
  auto expect = [](const std::string& text, const std::string& needle) {
    auto entries = ParseRunFile(text, "run.yaml", "rlfleet-trainer");
    ASSERT_FALSE(entries.ok()) << text;
    EXPECT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(entries.status().message(), needle)) << entries.status();
  };
  expect("model:\n  dir: x\nmodels:\n  a: 1\n", "run.yaml:3: unknown section `models`");
  expect("model:\n  dir: x\n  width: 3\n", "run.yaml:3: unknown key `model.width` (model has: d_model, dir,");
  expect("fleet:\n  replicas: 3\n", "run.yaml:2: unknown key `fleet.replicas`");
  expect("trainer: 7\n", "run.yaml:1: section `trainer` must be a mapping");
  expect("trainer:\n  port: 1\n  port: 2\n", "run.yaml:3: `trainer.port` given twice");
  expect("trainer:\n  port: [1, [2]]\n", "`trainer.port`: a list of scalars only");
  expect("trainer:\n  port: 1\n bad: [\n", "run.yaml:");
  expect("- a\n- b\n", "a mapping of sections");
}

TEST(RunFile, FlagsTakeTheValuesAndBadOnesAreNamed) {
  auto entries = ParseRunFile("model:\n  d_model: 64\ntrainer:\n  test_port: 7\n  test_name: from-yaml\n", "run.yaml",
                              "rlfleet-trainer");
  ASSERT_TRUE(entries.ok()) << entries.status();
  // (this test binary has no --d_model: the shared section's key is skipped)
  ASSERT_TRUE(ApplyConfigToFlags(*entries, "run.yaml").ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_port), 7);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "from-yaml");

  entries = ParseRunFile("trainer:\n  test_port: seven\n", "run.yaml", "rlfleet-trainer");
  ASSERT_TRUE(entries.ok());
  absl::Status bad = ApplyConfigToFlags(*entries, "run.yaml");
  EXPECT_TRUE(absl::StrContains(bad.message(), "run.yaml:2: bad value `seven` for `trainer.test_port`")) << bad;
  entries = ParseRunFile("trainer:\n  nope: 1\n", "run.yaml", "rlfleet-trainer");
  ASSERT_TRUE(entries.ok());
  bad = ApplyConfigToFlags(*entries, "run.yaml");
  EXPECT_TRUE(absl::StrContains(bad.message(), "run.yaml:2: unknown key `trainer.nope`")) << bad;
}

}  // namespace
}  // namespace rlfleet::common

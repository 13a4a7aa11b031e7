// The README's Python orchestrator example drives a real trainer over gRPC.
#include <cstdlib>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

TEST(PythonClient, TheReadmeExampleTrainsChecksAndSavesThroughTheTrainerApi) {
  testing::Subprocess trainer;
  const std::string tmp = std::getenv("TEST_TMPDIR");
  // Checkpoint paths must lie under the trainer's --checkpoint_root.
  auto address = testing::StartService(
      trainer, "services/trainer/rlfleet-trainer",
      {"--d_model=32", "--n_layers=2", "--n_heads=4", "--max_seq_len=32", "--checkpoint_root=" + tmp});
  ASSERT_TRUE(address.ok()) << address.status();
  const std::string out = tmp + "/py";
  std::filesystem::create_directories(out);
  // Message classes from the same .proto files, with Debian's protoc.
  const std::string protos = testing::RunfilePath("proto");
  const std::string protoc =
      absl::StrCat("/usr/bin/protoc -I ", protos, " --python_out=", out, " ", protos, "/rlfleet/v1/*.proto");
  ASSERT_EQ(std::system(protoc.c_str()), 0) << protoc;
  testing::Subprocess client;
  ASSERT_TRUE(client
                  .Start({"/usr/bin/env", "PYTHONPATH=" + out, "/usr/bin/python3",
                          testing::RunfilePath("examples/python/trainer_client.py"), "--trainer=" + *address,
                          "--checkpoint=" + tmp + "/ckpt"})
                  .ok());
  auto line = client.WaitForLine([](const std::string& l) { return absl::StartsWith(l, "{"); }, absl::Seconds(120));
  ASSERT_TRUE(line.ok()) << line.status() << "\n" << client.output();
  auto exited = client.Wait(absl::Seconds(30));
  ASSERT_TRUE(exited.ok());
  EXPECT_EQ(*exited, 0) << client.output();
  EXPECT_TRUE(absl::StrContains(*line, "\"step\": 2")) << *line;
  EXPECT_TRUE(absl::StrContains(*line, "\"checkpoint_step\": 2")) << *line;
  EXPECT_TRUE(absl::StrContains(*line, "\"bad_request\": \"INVALID_ARGUMENT: ")) << *line;
  EXPECT_TRUE(std::filesystem::exists(tmp + "/ckpt/weights.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(tmp + "/ckpt/optimizer.safetensors"));
}

}  // namespace
}  // namespace rlfleet

// Two trainer processes as data-parallel ranks over Gloo on loopback end where one
// trainer training on the same batches does; a dead rank is an error, not a hang.
#include <grpcpp/create_channel.h>
#include <signal.h>

#include <cmath>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/model/safetensors.h"
#include "rlfleet/v1/trainer.grpc.pb.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

const std::vector<std::string> kModel = {"--d_model=32", "--n_layers=2", "--n_heads=4", "--max_seq_len=32",
                                         "--threads=1"};

// Checkpoints go under the test's directory (the trainer's --checkpoint_root).
std::string RootFlag() { return std::string("--checkpoint_root=") + std::getenv("TEST_TMPDIR"); }

std::vector<std::string> With(std::vector<std::string> flags) {
  flags.insert(flags.begin(), kModel.begin(), kModel.end());
  flags.push_back(RootFlag());
  return flags;
}

// The trainer binary's argv: the binary, the model flags, then `flags`.
std::vector<std::string> Trainer(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {testing::RunfilePath("services/trainer/rlfleet-trainer")};
  argv.insert(argv.end(), kModel.begin(), kModel.end());
  argv.push_back(RootFlag());
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

// Two GRPO groups of 4 with responses of different lengths (ranks get unequal tokens).
v1::TrainStepRequest Step(int step) {
  v1::TrainStepRequest r;
  r.set_expected_step(step + 1);
  r.mutable_params()->set_algorithm(v1::ALGORITHM_GRPO);
  r.mutable_params()->set_ppo_epochs(2);
  for (int i = 0; i < 8; ++i) {
    v1::Experience* e = r.mutable_inline_batch()->add_experiences();
    e->mutable_experience_id()->set_value(absl::StrCat("s", step, "-", i));
    e->set_group_id(absl::StrCat("g", i / 4));
    for (int t : {1, 4, 5 + i % 3}) e->add_prompt_token_ids(t);
    for (int j = 0; j <= (i + step) % 4; ++j) e->add_response_token_ids(6 + (i * 3 + j) % 20);
    e->add_response_token_ids(2);
    for (int j = 0; j < e->response_token_ids_size(); ++j) e->add_response_logprobs(-3.0f);
    e->set_reward(static_cast<float>((i * 7 + step) % 3));
  }
  return r;
}

std::unique_ptr<v1::TrainerService::Stub> Stub(const std::string& address) {
  return v1::TrainerService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

grpc::Status Call(v1::TrainerService::Stub* stub, const v1::TrainStepRequest& request, v1::TrainStepResponse* out,
                  int seconds = 60) {
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return stub->TrainStep(&c, request, out);
}

std::string Save(v1::TrainerService::Stub* stub, const std::string& path) {
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::SaveCheckpointRequest r;
  r.set_path(path);
  v1::SaveCheckpointResponse out;
  grpc::Status s = stub->SaveCheckpoint(&c, r, &out);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return path + "/weights.safetensors";
}

// Two trainer processes (rank 0 with `flags0`, rank 1 with `flags1` added) against one
// single-rank trainer on the same batches; then rank 1 dies.
void TwoRanksEqualOneRankAndADeadRankIsAnError(const std::vector<std::string>& flags0,
                                               const std::vector<std::string>& flags1,
                                               const std::string& expect_in_rank0) {
  const std::string tmp = std::string(std::getenv("TEST_TMPDIR")) + "/" + std::to_string(flags0.size());
  testing::Subprocess single, rank0, rank1;
  auto single_address = testing::StartService(single, "services/trainer/rlfleet-trainer", With({}));
  ASSERT_TRUE(single_address.ok()) << single_address.status();
  // Rank 0 prints its rendezvous port, rank 1 joins it, then rank 0 serves.
  std::vector<std::string> args0 = {"--host=127.0.0.1", "--port=0", "--dp_world=2", "--dp_rank=0", "--dp_timeout=10s"};
  args0.insert(args0.end(), flags0.begin(), flags0.end());
  ASSERT_TRUE(rank0.Start(Trainer(args0)).ok());
  auto rendezvous = rank0.WaitForLine([](const std::string& l) { return absl::StrContains(l, "dp rendezvous on "); },
                                      absl::Seconds(60));
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status();
  const std::string port = rendezvous->substr(
      rendezvous->rfind(':') + 1, rendezvous->find(' ', rendezvous->rfind(':')) - rendezvous->rfind(':') - 1);
  std::vector<std::string> args1 = {"--dp_world=2", "--dp_rank=1", "--dp_port=" + port, "--dp_timeout=10s"};
  args1.insert(args1.end(), flags1.begin(), flags1.end());
  ASSERT_TRUE(rank1.Start(Trainer(args1)).ok());
  auto listening =
      rank0.WaitForLine([](const std::string& l) { return absl::StrContains(l, "listening on "); }, absl::Seconds(60));
  ASSERT_TRUE(listening.ok()) << listening.status() << rank1.output();
  EXPECT_TRUE(absl::StrContains(rank0.output(), expect_in_rank0)) << rank0.output();
  const std::string dp_address = listening->substr(listening->rfind(' ') + 1);

  auto one = Stub(*single_address), dp = Stub(dp_address);
  for (int step = 0; step < 3; ++step) {
    v1::TrainStepResponse a, b;
    grpc::Status sa = Call(one.get(), Step(step), &a), sb = Call(dp.get(), Step(step), &b);
    ASSERT_TRUE(sa.ok()) << sa.error_message();
    ASSERT_TRUE(sb.ok()) << sb.error_message();
    EXPECT_EQ(b.step(), static_cast<uint64_t>(step + 1));
  }
  auto wa = model::ReadSafetensors(Save(one.get(), tmp + "/one"));
  auto wb = model::ReadSafetensors(Save(dp.get(), tmp + "/dp"));
  ASSERT_TRUE(wa.ok() && wb.ok());
  ASSERT_EQ(wa->size(), wb->size());
  float worst = 0;
  for (const auto& [name, blob] : *wa) {
    const auto& other = wb->at(name).bytes;
    ASSERT_EQ(blob.bytes.size(), other.size()) << name;
    const float* x = reinterpret_cast<const float*>(blob.bytes.data());
    const float* y = reinterpret_cast<const float*>(other.data());
    for (size_t i = 0; i < blob.bytes.size() / 4; ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
  }
  EXPECT_LT(worst, 1e-4f) << "two ranks drifted from one rank on the same batches";

  // A batch smaller than the ranks is refused before anything runs.
  v1::TrainStepRequest tiny = Step(3);
  tiny.mutable_inline_batch()->mutable_experiences()->DeleteSubrange(1, 7);
  v1::TrainStepResponse out;
  EXPECT_EQ(Call(dp.get(), tiny, &out).error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  // Kill rank 1: rank 0's next step is an error within its 10 s deadline, not a hang.
  ASSERT_TRUE(rank1.Signal(SIGKILL).ok());
  (void)rank1.Wait(absl::Seconds(10));
  const absl::Time start = absl::Now();
  grpc::Status dead = Call(dp.get(), Step(3), &out, 120);
  EXPECT_FALSE(dead.ok());
  EXPECT_TRUE(dead.error_code() == grpc::StatusCode::UNAVAILABLE ||
              dead.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
      << dead.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
}

TEST(DataParallelTrainer, TwoRanksOverGlooEqualOneRankAndADeadRankIsAnError) {
  TwoRanksEqualOneRankAndADeadRankIsAnError({}, {}, "rank 0 of 2 joined");
}

// The topology-aware all-reduce over UCX, the ranks on two "nodes".
TEST(DataParallelTrainer, TwoRanksHierarchicalOverUcxEqualOneRankAndADeadRankIsAnError) {
  TwoRanksEqualOneRankAndADeadRankIsAnError({"--dp_allreduce=hierarchical", "--dp_node=node-a"},
                                            {"--dp_allreduce=hierarchical", "--dp_node=node-b"},
                                            "all-reduce hierarchical over 2 node(s), wire fp32");
}

}  // namespace
}  // namespace rlfleet

#include "services/trainer/trainer_core.h"

#include <sys/stat.h>

#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/model/test_util.h"
#include "libs/model/tokenizer.h"
#include "services/buffer/buffer_core.h"

namespace rlfleet::trainer {
namespace {

model::PolicyConfig Small() { return model::TinyConfig(); }

// The checkpoint root of these tests.
std::string Root() { return std::string(getenv("TEST_TMPDIR")); }

// A BufferSource over an in-process BufferCore.
class CoreSource : public BufferSource {
 public:
  explicit CoreSource(buffer::BufferCore* core) : core_(core) {}
  absl::Status Sample(const v1::SampleBatchRequest& r, v1::SampleBatchResponse* out) override {
    return core_->SampleBatch(r, out);
  }
  absl::Status Ack(const std::string& lease) override {
    v1::AckBatchRequest r;
    r.set_lease_id(lease);
    v1::AckBatchResponse out;
    return core_->Ack(r, &out);
  }
  absl::Status Nack(const std::string& lease, const std::string&) override {
    v1::NackBatchRequest r;
    r.set_lease_id(lease);
    v1::NackBatchResponse out;
    return core_->Nack(r, &out);
  }

 private:
  buffer::BufferCore* core_;
};

v1::Experience Exp(const std::string& id, const std::string& group, float reward, bool bad = false) {
  v1::Experience e;
  e.mutable_experience_id()->set_value(id);
  e.set_group_id(group);
  const auto prompt = model::Tokenizer::EncodePrompt("reverse:12");
  for (int32_t t : *prompt) e.add_prompt_token_ids(t);
  const auto response = model::Tokenizer::EncodeResponse("21");
  for (int32_t t : *response) {
    e.add_response_token_ids(t);
    e.add_response_logprobs(-3.0f);
    e.add_token_policy_versions(1);
  }
  if (bad) e.add_response_logprobs(-1.0f);
  e.set_reward(reward);
  return e;
}

TEST(TrainerCore, InlineStepUpdatesStepVersionAndMetrics) {
  auto core = TrainerCore::Create(Small(), model::TestDevice(), 1);
  ASSERT_TRUE(core.ok()) << core.status();
  v1::TrainStepRequest request;
  for (int i = 0; i < 4; ++i)
    *request.mutable_inline_batch()->add_experiences() = Exp(absl::StrCat("e", i), "g", i % 2);
  request.set_expected_step(1);
  v1::TrainStepResponse response;
  absl::Status s = (*core)->TrainStep(request, &response);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(response.step(), 1u);
  EXPECT_EQ(response.new_policy_version().version(), 2u);
  EXPECT_EQ(response.metrics().sequences(), 4u);
  EXPECT_EQ(response.metrics().tokens(), 12u);  // "21" + EOS, 4 times
  EXPECT_FLOAT_EQ(response.metrics().reward_mean(), 0.5f);
  // A retried step that already ran is refused.
  v1::TrainStepResponse again;
  EXPECT_EQ((*core)->TrainStep(request, &again).code(), absl::StatusCode::kFailedPrecondition);
  v1::GetStateResponse state;
  ASSERT_TRUE((*core)->GetState(&state).ok());
  EXPECT_EQ(state.step(), 1u);
  EXPECT_EQ(state.last_metrics().sequences(), 4u);
}

TEST(TrainerCore, BufferBatchesAreAckedAndFailedStepsNackedSoNothingIsLost) {
  buffer::BufferCore buffer;
  v1::ConfigureRequest c;
  c.set_group_size(2);
  v1::ConfigureResponse cr;
  ASSERT_TRUE(buffer.Configure(c, &cr).ok());
  CoreSource source(&buffer);
  auto core = TrainerCore::Create(Small(), model::TestDevice(), 1, &source);
  v1::PutExperiencesRequest put;
  *put.add_experiences() = Exp("a1", "A", 1);
  *put.add_experiences() = Exp("a2", "A", 0);
  v1::PutExperiencesResponse pr;
  ASSERT_TRUE(buffer.Put(put, &pr).ok());
  v1::TrainStepRequest request;
  request.mutable_buffer()->set_num_groups(1);
  v1::TrainStepResponse response;
  ASSERT_TRUE((*core)->TrainStep(request, &response).ok());
  EXPECT_FALSE(response.lease_id().empty());
  v1::GetStatsResponse stats;
  ASSERT_TRUE(buffer.GetStats(&stats).ok());
  EXPECT_EQ(stats.consumed_total(), 2u);
  // No groups left: the step says so (UNAVAILABLE: retry), and takes nothing.
  EXPECT_EQ((*core)->TrainStep(request, &response).code(), absl::StatusCode::kUnavailable);

  // A step that fails after sampling (sequences longer than the model) nacks its
  // lease: the group is back in the buffer, not lost.
  v1::PutExperiencesRequest long_put;
  for (const char* id : {"b1", "b2"}) {
    v1::Experience e = Exp(id, "B", id[1] == '1' ? 1.0f : 0.0f);
    for (int i = 0; i < 40; ++i) {
      e.add_response_token_ids(9);
      e.add_response_logprobs(-1.0f);
      e.add_token_policy_versions(1);
    }
    *long_put.add_experiences() = e;
  }
  ASSERT_TRUE(buffer.Put(long_put, &pr).ok());
  ASSERT_EQ(pr.accepted(), 2u);
  EXPECT_EQ((*core)->TrainStep(request, &response).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(buffer.GetStats(&stats).ok());
  EXPECT_EQ(stats.complete_groups(), 1u);
  EXPECT_EQ(stats.open_leases(), 0u);
}

TEST(TrainerCore, CheckpointRoundTripRestoresWeightsAndState) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/ckpt";
  auto core = TrainerCore::Create(Small(), model::TestDevice(), 1, nullptr, nullptr, Root());
  v1::TrainStepRequest request;
  for (int i = 0; i < 4; ++i)
    *request.mutable_inline_batch()->add_experiences() = Exp(absl::StrCat("e", i), "g", i % 2);
  v1::TrainStepResponse response;
  ASSERT_TRUE((*core)->TrainStep(request, &response).ok());
  v1::SaveCheckpointRequest save;
  save.set_path(dir);
  v1::SaveCheckpointResponse saved;
  ASSERT_TRUE((*core)->SaveCheckpoint(save, &saved).ok());
  EXPECT_EQ(saved.step(), 1u);
  EXPECT_GT(saved.size_bytes(), 0u);
  EXPECT_EQ((*core)->SaveCheckpoint(save, &saved).code(), absl::StatusCode::kAlreadyExists);
  const std::vector<std::vector<int32_t>> probe = {*model::Tokenizer::EncodePrompt("reverse:12")};
  const auto at_save = *(*core)->policy()->Logits(probe);
  ASSERT_TRUE((*core)->TrainStep(request, &response).ok());  // moves away
  ASSERT_NE(*(*core)->policy()->Logits(probe), at_save);
  v1::LoadCheckpointRequest load;
  load.set_path(dir);
  v1::LoadCheckpointResponse loaded;
  ASSERT_TRUE((*core)->LoadCheckpoint(load, &loaded).ok());
  EXPECT_EQ(loaded.step(), 1u);
  EXPECT_EQ(loaded.policy_version().version(), 2u);
  EXPECT_EQ(*(*core)->policy()->Logits(probe), at_save);
  load.set_path(dir + "-missing");
  EXPECT_EQ((*core)->LoadCheckpoint(load, &loaded).code(), absl::StatusCode::kNotFound);
}

// A trainer restarted by its supervisor (--resume=latest) goes on from the checkpoint
// written last under its root, and numbers its weights past the fleet's newest when
// asked (PublishWeights.min_version): no version number ever names two sets of weights.
TEST(TrainerCore, ResumesFromTheLatestCheckpointAndRenumbersPastTheFleetsVersion) {
  const std::string root = Root() + "/resume-root";
  std::filesystem::create_directories(root + "/run-a");
  auto fresh = TrainerCore::Create(Small(), model::TestDevice(), 1, nullptr, nullptr, root);
  v1::LoadCheckpointResponse loaded;
  EXPECT_EQ((*fresh)->ResumeLatest(&loaded).status().code(), absl::StatusCode::kNotFound);

  auto core = TrainerCore::Create(Small(), model::TestDevice(), 1, nullptr, nullptr, root);
  v1::TrainStepRequest request;
  for (int i = 0; i < 4; ++i)
    *request.mutable_inline_batch()->add_experiences() = Exp(absl::StrCat("e", i), "g", i % 2);
  v1::TrainStepResponse response;
  v1::SaveCheckpointResponse saved;
  for (const char* path : {"run-a/step-1", "run-a/step-2"}) {
    ASSERT_TRUE((*core)->TrainStep(request, &response).ok());
    v1::SaveCheckpointRequest save;
    save.set_path(path);
    ASSERT_TRUE((*core)->SaveCheckpoint(save, &saved).ok());
  }
  // A save in progress (a crash mid-write) and a file that is no checkpoint are no candidates.
  std::filesystem::copy(root + "/run-a/step-2", root + "/run-a/step-3.tmp-99");
  std::ofstream(root + "/run-a/step-3.tmp-99/state.txt", std::ios::app) << "\n";
  const std::vector<std::vector<int32_t>> probe = {*model::Tokenizer::EncodePrompt("reverse:12")};
  const auto at_step_2 = *(*core)->policy()->Logits(probe);

  auto restarted = TrainerCore::Create(Small(), model::TestDevice(), 1, nullptr, nullptr, root);
  absl::StatusOr<std::string> from = (*restarted)->ResumeLatest(&loaded);
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_TRUE(absl::EndsWith(*from, "run-a/step-2")) << *from;
  EXPECT_EQ(loaded.step(), 2u);
  EXPECT_EQ(loaded.policy_version().version(), 3u);
  EXPECT_EQ(*(*restarted)->policy()->Logits(probe), at_step_2);

  // The replicas already serve version 7 (trained after that checkpoint): the resumed
  // weights are published as 8, and a lower floor changes nothing.
  const std::string publish_dir = Root() + "/resume-publish";
  v1::PublishWeightsRequest publish;
  publish.set_min_version(8);
  v1::PublishWeightsResponse published;
  ASSERT_TRUE((*restarted)->Publish({publish_dir}, publish, &published).ok());
  EXPECT_EQ(published.manifest().version().version(), 8u);
  publish.set_min_version(5);
  publish.set_idempotent(true);
  ASSERT_TRUE((*restarted)->Publish({publish_dir}, publish, &published).ok());
  EXPECT_EQ(published.manifest().version().version(), 8u);
  publish.set_min_version((uint64_t{1} << 48) + 1);
  EXPECT_EQ((*restarted)->Publish({publish_dir}, publish, &published).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TrainerCore, ACheckpointCarriesTheOptimizerAndRefusesCorruptionAndOtherModels) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/ckpt-opt";
  v1::TrainStepRequest request;
  for (int i = 0; i < 4; ++i)
    *request.mutable_inline_batch()->add_experiences() = Exp(absl::StrCat("e", i), "g", i % 2);
  v1::TrainStepResponse response;
  auto a = TrainerCore::Create(Small(), model::TestDevice(), 1, nullptr, nullptr, Root());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*a)->TrainStep(request, &response).ok());
  v1::SaveCheckpointRequest save;
  save.set_path(dir);
  v1::SaveCheckpointResponse saved;
  ASSERT_TRUE((*a)->SaveCheckpoint(save, &saved).ok());
  ASSERT_TRUE((*a)->TrainStep(request, &response).ok());
  // Another trainer (another init) resumes from the checkpoint: its next step lands
  // where the first trainer's did (AdamW's moments and step count came along).
  auto b = TrainerCore::Create(Small(), model::TestDevice(), 99, nullptr, nullptr, Root());
  v1::LoadCheckpointRequest load;
  load.set_path(dir);
  v1::LoadCheckpointResponse loaded;
  ASSERT_TRUE((*b)->LoadCheckpoint(load, &loaded).ok());
  ASSERT_TRUE((*b)->TrainStep(request, &response).ok());
  const std::vector<std::vector<int32_t>> probe = {*model::Tokenizer::EncodePrompt("reverse:12")};
  const auto la = *(*a)->policy()->Logits(probe), lb = *(*b)->policy()->Logits(probe);
  float worst = 0;
  for (size_t i = 0; i < la.size(); ++i) worst = std::max(worst, std::fabs(la[i] - lb[i]));
  EXPECT_LT(worst, 1e-5f);
  // A model of another shape is FAILED_PRECONDITION; a flipped byte is DATA_LOSS.
  model::PolicyConfig other = Small();
  other.d_model = 64;
  auto c = TrainerCore::Create(other, model::TestDevice(), 1, nullptr, nullptr, Root());
  EXPECT_EQ((*c)->LoadCheckpoint(load, &loaded).code(), absl::StatusCode::kFailedPrecondition);
  {
    std::fstream f(dir + "/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x40;
    f.seekp(-5, std::ios::end);
    f.write(&byte, 1);
  }
  absl::Status corrupt = (*b)->LoadCheckpoint(load, &loaded);
  EXPECT_EQ(corrupt.code(), absl::StatusCode::kDataLoss) << corrupt;
  EXPECT_TRUE(absl::StrContains(corrupt.message(), "optimizer.safetensors")) << corrupt;
}

// A buffer that hands out scripted groups (each Sample the next list, under a new
// lease, as a real buffer does once a lease expired) and answers acks from a script.
class ScriptedBuffer : public BufferSource {
 public:
  std::deque<std::vector<v1::ExperienceGroup>> samples;
  std::deque<absl::Status> ack_results;  // then OK
  std::vector<std::string> acked, nacked;

  absl::Status Sample(const v1::SampleBatchRequest&, v1::SampleBatchResponse* out) override {
    if (samples.empty()) return absl::OkStatus();  // (no groups: empty lease)
    out->set_lease_id(absl::StrCat("L", ++leases_));
    for (const auto& g : samples.front()) *out->add_groups() = g;
    samples.pop_front();
    return absl::OkStatus();
  }
  absl::Status Ack(const std::string& lease) override {
    acked.push_back(lease);
    if (ack_results.empty()) return absl::OkStatus();
    absl::Status s = ack_results.front();
    ack_results.pop_front();
    return s;
  }
  absl::Status Nack(const std::string& lease, const std::string&) override {
    nacked.push_back(lease);
    return absl::OkStatus();
  }

 private:
  int leases_ = 0;
};

v1::ExperienceGroup Group(const std::string& id) {
  v1::ExperienceGroup g;
  g.set_group_id(id);
  *g.add_experiences() = Exp(id + "-1", id, 1);
  *g.add_experiences() = Exp(id + "-2", id, 0);
  return g;
}

v1::TrainStepRequest FromBuffer() {
  v1::TrainStepRequest r;
  r.mutable_buffer()->set_num_groups(2);
  return r;
}

TEST(TrainerCore, AFailedAckNeverTrainsABatchTwice) {
  ScriptedBuffer buffer;
  auto core = TrainerCore::Create(Small(), model::TestDevice(), 1, &buffer);
  ASSERT_TRUE(core.ok());
  // Step 1 trains A; its ack fails (the buffer is briefly unreachable).
  buffer.samples.push_back({Group("A")});
  buffer.ack_results = {absl::UnavailableError("buffer down"),
                        absl::FailedPreconditionError("lease L1 expired; its groups went back")};
  v1::TrainStepResponse r;
  ASSERT_TRUE((*core)->TrainStep(FromBuffer(), &r).ok());
  EXPECT_EQ(r.step(), 1u);  // the update happened, so the step counts
  EXPECT_EQ(r.new_policy_version().version(), 2u);
  // Step 2: the ack is retried (expired), then the buffer hands A out again alone: it
  // is acked without training, and the step trains the next lease (B).
  buffer.samples.push_back({Group("A")});
  buffer.samples.push_back({Group("B")});
  ASSERT_TRUE((*core)->TrainStep(FromBuffer(), &r).ok());
  EXPECT_EQ(r.step(), 2u);
  EXPECT_EQ(r.new_policy_version().version(), 3u);
  EXPECT_EQ(r.metrics().sequences(), 2u);  // B only
  EXPECT_EQ(r.lease_id(), "L3");
  EXPECT_EQ(buffer.acked, (std::vector<std::string>{"L1", "L1", "L2", "L3"}));
  EXPECT_TRUE(buffer.nacked.empty());
  // A was consumed with L2: it is not remembered any more, so a new A trains.
  buffer.samples.push_back({Group("A")});
  ASSERT_TRUE((*core)->TrainStep(FromBuffer(), &r).ok());
  EXPECT_EQ(r.metrics().sequences(), 2u);

  // A trained group handed out again together with a new one: only the new one trains.
  ScriptedBuffer mixed;
  auto other = TrainerCore::Create(Small(), model::TestDevice(), 1, &mixed);
  mixed.samples.push_back({Group("A")});
  mixed.samples.push_back({Group("A"), Group("B")});
  mixed.ack_results = {absl::UnavailableError("buffer down"), absl::FailedPreconditionError("expired")};
  ASSERT_TRUE((*other)->TrainStep(FromBuffer(), &r).ok());
  ASSERT_TRUE((*other)->TrainStep(FromBuffer(), &r).ok());
  EXPECT_EQ(r.step(), 2u);
  EXPECT_EQ(r.metrics().sequences(), 2u);  // B only
  EXPECT_EQ(mixed.acked, (std::vector<std::string>{"L1", "L1", "L2"}));
}

TEST(TrainerCore, AFailedAckIsRetriedBeforeTheNextSample) {
  ScriptedBuffer buffer;
  auto core = TrainerCore::Create(Small(), model::TestDevice(), 1, &buffer);
  buffer.samples.push_back({Group("A")});
  buffer.samples.push_back({Group("B")});
  buffer.ack_results = {absl::UnavailableError("buffer down")};
  v1::TrainStepResponse r;
  ASSERT_TRUE((*core)->TrainStep(FromBuffer(), &r).ok());
  ASSERT_TRUE((*core)->TrainStep(FromBuffer(), &r).ok());
  EXPECT_EQ(r.step(), 2u);
  EXPECT_EQ(buffer.acked, (std::vector<std::string>{"L1", "L1", "L2"}));  // L1 retried, then consumed
  // Only already-trained groups, again and again: acked, nothing trained, UNAVAILABLE.
  ScriptedBuffer replay;
  auto other = TrainerCore::Create(Small(), model::TestDevice(), 1, &replay);
  replay.samples.push_back({Group("A")});
  replay.ack_results = {absl::UnavailableError("down"), absl::FailedPreconditionError("expired")};
  ASSERT_TRUE((*other)->TrainStep(FromBuffer(), &r).ok());
  replay.ack_results = {absl::UnavailableError("down"), absl::UnavailableError("down"), absl::UnavailableError("down"),
                        absl::UnavailableError("down")};
  for (int i = 0; i < 4; ++i) replay.samples.push_back({Group("A")});
  EXPECT_EQ((*other)->TrainStep(FromBuffer(), &r).code(), absl::StatusCode::kUnavailable);
  v1::GetStateResponse state;
  ASSERT_TRUE((*other)->GetState(&state).ok());
  EXPECT_EQ(state.step(), 1u);
}

TEST(TrainerCore, ANonFiniteLossInALaterUpdateUndoesTheWholeStep) {
  // Two mini-batches: the first is fine (an update happens), the second has behaviour
  // log-probs of -1e30 (an infinite loss): weights and optimizer state go back.
  v1::TrainStepRequest poisoned;
  for (int i = 0; i < 4; ++i) {
    v1::Experience e = Exp(absl::StrCat("e", i), i < 2 ? "g0" : "g1", i % 2);
    if (i >= 2) {
      for (int j = 0; j < e.response_logprobs_size(); ++j) e.set_response_logprobs(j, -1e30f);
    }
    *poisoned.mutable_inline_batch()->add_experiences() = e;
  }
  poisoned.mutable_params()->set_mini_batches(2);
  v1::TrainStepRequest good;
  for (int i = 0; i < 4; ++i) *good.mutable_inline_batch()->add_experiences() = Exp(absl::StrCat("e", i), "g", i % 2);
  good.mutable_params()->set_ppo_epochs(2);
  auto a = TrainerCore::Create(Small(), model::TestDevice(), 1),
       b = TrainerCore::Create(Small(), model::TestDevice(), 1);
  const std::vector<std::vector<int32_t>> probe = {*model::Tokenizer::EncodePrompt("reverse:12")};
  const auto initial = *(*a)->policy()->Logits(probe);
  v1::TrainStepResponse r;
  absl::Status s = (*a)->TrainStep(poisoned, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(*(*a)->policy()->Logits(probe), initial);
  // ... and the optimizer too: the next step lands where a fresh trainer's does.
  ASSERT_TRUE((*a)->TrainStep(good, &r).ok());
  EXPECT_EQ(r.step(), 1u);
  ASSERT_TRUE((*b)->TrainStep(good, &r).ok());
  EXPECT_EQ(*(*a)->policy()->Logits(probe), *(*b)->policy()->Logits(probe));
}

TEST(TrainerCore, CheckpointPathsStayUnderTheRoot) {
  const std::string root = Root() + "/root-a";
  std::filesystem::create_directories(root);
  auto core = TrainerCore::Create(Small(), model::TestDevice(), 1, nullptr, nullptr, root);
  v1::SaveCheckpointRequest save;
  v1::SaveCheckpointResponse saved;
  for (const std::string& bad : {Root() + "/outside", std::string("../outside"), std::string("a/../../outside"),
                                 std::string("/etc"), root, std::string(".")}) {
    save.set_path(bad);
    save.set_overwrite(true);
    absl::Status s = (*core)->SaveCheckpoint(save, &saved);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "path")) << s;
  }
  EXPECT_FALSE(std::filesystem::exists(Root() + "/outside"));
  // A link inside the root that leads out of it is outside too.
  std::filesystem::create_directories(Root() + "/elsewhere");
  std::filesystem::create_directory_symlink(Root() + "/elsewhere", root + "/link");
  save.set_path("link/ckpt");
  EXPECT_EQ((*core)->SaveCheckpoint(save, &saved).code(), absl::StatusCode::kInvalidArgument);
  v1::LoadCheckpointRequest load;
  load.set_path("/etc");
  v1::LoadCheckpointResponse loaded;
  EXPECT_EQ((*core)->LoadCheckpoint(load, &loaded).code(), absl::StatusCode::kInvalidArgument);
  // Relative paths resolve under the root; no root at all: no checkpoints.
  save.set_path("nested/ok");
  ASSERT_TRUE((*core)->SaveCheckpoint(save, &saved).ok());
  EXPECT_EQ(saved.path(), std::filesystem::canonical(root).string() + "/nested/ok");
  auto rootless = TrainerCore::Create(Small(), model::TestDevice(), 1);
  EXPECT_EQ((*rootless)->SaveCheckpoint(save, &saved).code(), absl::StatusCode::kInvalidArgument);
}

// A dry run (how a run checks its checkpoint_dir at its start) refuses what a save
// would refuse and writes nothing.
TEST(TrainerCore, ADryRunChecksThePathAndWritesNothing) {
  const std::string root = Root() + "/root-dry";
  auto core = TrainerCore::Create(Small(), model::TestDevice(), 1, nullptr, nullptr, root);
  v1::SaveCheckpointRequest save;
  save.set_dry_run(true);
  v1::SaveCheckpointResponse saved;
  save.set_path("/etc/ckpt");
  EXPECT_EQ((*core)->SaveCheckpoint(save, &saved).code(), absl::StatusCode::kInvalidArgument);
  save.set_path("runs/run-a-step-0");
  ASSERT_TRUE((*core)->SaveCheckpoint(save, &saved).ok());
  EXPECT_EQ(saved.path(), std::filesystem::canonical(root).string() + "/runs/run-a-step-0");
  EXPECT_FALSE(std::filesystem::exists(root + "/runs/run-a-step-0"));
  EXPECT_TRUE(std::filesystem::is_empty(root + "/runs"));  // (no temporaries either)
  // A folder that cannot be written: a file where the folder should be.
  std::ofstream(root + "/blocked") << "x";
  save.set_path("blocked/run-a-step-0");
  EXPECT_FALSE((*core)->SaveCheckpoint(save, &saved).ok());
  // An existing path without overwrite, as a save.
  std::filesystem::create_directories(root + "/taken");
  save.set_path("taken");
  EXPECT_EQ((*core)->SaveCheckpoint(save, &saved).code(), absl::StatusCode::kAlreadyExists);
}

TEST(TrainerCore, OverwriteReplacesOnlyACheckpointThisTrainerWrote) {
  const std::string root = Root() + "/root-b";
  auto core = TrainerCore::Create(Small(), model::TestDevice(), 1, nullptr, nullptr, root);
  std::filesystem::create_directories(root + "/precious");
  std::ofstream(root + "/precious/thesis.tex") << "years of work";
  v1::SaveCheckpointRequest save;
  save.set_path("precious");
  save.set_overwrite(true);
  v1::SaveCheckpointResponse saved;
  EXPECT_EQ((*core)->SaveCheckpoint(save, &saved).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(std::filesystem::exists(root + "/precious/thesis.tex"));
  // A checkpoint with a stranger's file in it is not one of ours either.
  save.set_path("ckpt");
  ASSERT_TRUE((*core)->SaveCheckpoint(save, &saved).ok());
  ASSERT_TRUE((*core)->SaveCheckpoint(save, &saved).ok());  // ours: replaced
  std::ofstream(root + "/ckpt/notes.txt") << "mine";
  EXPECT_EQ((*core)->SaveCheckpoint(save, &saved).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(std::filesystem::exists(root + "/ckpt/notes.txt"));
  // A file (not a directory) is not replaced.
  std::ofstream(root + "/plain") << "x";
  save.set_path("plain");
  EXPECT_EQ((*core)->SaveCheckpoint(save, &saved).code(), absl::StatusCode::kFailedPrecondition);
  // Nothing but the checkpoints is left behind (no temporaries).
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(root)) entries += e.path().filename() != "" ? 1 : 0;
  EXPECT_EQ(entries, 3);  // precious, ckpt, plain
}

TEST(TrainerCore, AStateFileCannotMakeTheTrainerReadOutsideItsCheckpoint) {
  const std::string root = Root() + "/root-c";
  auto core = TrainerCore::Create(Small(), model::TestDevice(), 1, nullptr, nullptr, root);
  v1::SaveCheckpointRequest save;
  save.set_path("ckpt");
  v1::SaveCheckpointResponse saved;
  ASSERT_TRUE((*core)->SaveCheckpoint(save, &saved).ok());
  const std::string dir = root + "/ckpt";
  std::string state;
  {
    std::ifstream in(dir + "/state.txt");
    state.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  v1::LoadCheckpointRequest load;
  load.set_path("ckpt");
  v1::LoadCheckpointResponse loaded;
  auto with_state = [&](const std::string& text) {
    std::ofstream(dir + "/state.txt", std::ios::trunc) << text;
    return (*core)->LoadCheckpoint(load, &loaded);
  };
  // Files named by absolute path or through ".." are not plain names.
  absl::Status s = with_state(state + "digest /dev/zero 0000000000000000\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  s = with_state(state + "digest ../../etc/passwd 0000000000000000\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  // A link in the checkpoint to /dev/zero: refused (outside), never read (no hang).
  std::filesystem::create_symlink("/dev/zero", dir + "/zero");
  s = with_state(state + "digest zero 0000000000000000\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // The weights file replaced by a FIFO or a link out: refused, not read.
  ASSERT_TRUE(with_state(state).ok());
  std::filesystem::rename(dir + "/weights.safetensors", dir + "/weights.real");
  ASSERT_EQ(mkfifo((dir + "/weights.safetensors").c_str(), 0600), 0);
  s = (*core)->LoadCheckpoint(load, &loaded);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  std::filesystem::remove(dir + "/weights.safetensors");
  std::filesystem::create_symlink("/dev/zero", dir + "/weights.safetensors");
  s = (*core)->LoadCheckpoint(load, &loaded);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  std::filesystem::remove(dir + "/weights.safetensors");
  std::filesystem::rename(dir + "/weights.real", dir + "/weights.safetensors");
  // Errors never echo what a file holds.
  s = with_state("version 2\nconfig SECRET-CONTENTS\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "SECRET")) << s;
  // Restored, it loads.
  EXPECT_TRUE(with_state(state).ok());
}

TEST(TrainerCore, PpoUsesTheValueHeadOrSaysItNeedsOne) {
  v1::TrainStepRequest request;
  for (int i = 0; i < 4; ++i)
    *request.mutable_inline_batch()->add_experiences() = Exp(absl::StrCat("e", i), "g", i % 2);
  request.mutable_params()->set_algorithm(v1::ALGORITHM_PPO);
  v1::TrainStepResponse response;
  auto plain = TrainerCore::Create(Small(), model::TestDevice(), 1);
  absl::Status s = (*plain)->TrainStep(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "value_head")) << s;
  model::PolicyConfig c = Small();
  c.value_head = true;
  auto critic = TrainerCore::Create(c, model::TestDevice(), 1);
  ASSERT_TRUE((*critic)->TrainStep(request, &response).ok());
  EXPECT_GT(response.metrics().value_loss(), 0.0f);
  EXPECT_EQ(response.step(), 1u);
  request.mutable_params()->set_gamma(1.5f);
  EXPECT_EQ((*critic)->TrainStep(request, &response).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TrainerCore, BadBatchesAreInvalidArgumentNamingTheField) {
  auto core = TrainerCore::Create(Small(), model::TestDevice(), 1);
  v1::TrainStepRequest empty;
  v1::TrainStepResponse r;
  EXPECT_EQ((*core)->TrainStep(empty, &r).code(), absl::StatusCode::kInvalidArgument);
  v1::TrainStepRequest bad;
  *bad.mutable_inline_batch()->add_experiences() = Exp("x", "g", 1, /*bad=*/true);
  absl::Status s = (*core)->TrainStep(bad, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "experiences[0].response_logprobs")) << s;
  v1::TrainStepRequest ppo;
  *ppo.mutable_inline_batch()->add_experiences() = Exp("y", "g", 1);
  ppo.mutable_params()->set_algorithm(v1::ALGORITHM_PPO);
  EXPECT_EQ((*core)->TrainStep(ppo, &r).code(), absl::StatusCode::kFailedPrecondition);  // no value head
}

}  // namespace
}  // namespace rlfleet::trainer

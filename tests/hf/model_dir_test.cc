// A Hugging Face checkpoint through the real services: a rollout replica started with
// --model_dir serves the directory's weights and decodes transformers' greedy tokens;
// a trainer started with it trains from those weights, publishes a version the replica
// installs, and writes checkpoints that are Hugging Face directories (config.json,
// model.safetensors, the tokenizer files) which load back; bad flags are refused.
#include <grpcpp/create_channel.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/model/hf_model.h"
#include "libs/model/safetensors.h"
#include "rlfleet/v1/rollout.grpc.pb.h"
#include "rlfleet/v1/trainer.grpc.pb.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

namespace fs = std::filesystem;
using testing::Subprocess;

std::unique_ptr<grpc::ClientContext> Context(int seconds = 60) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return c;
}

std::string Fixture(const std::string& arch) { return testing::RunfilePath("libs/model/testdata/hf/" + arch); }

// The greedy response the replica at `address` streams for `prompt`.
std::vector<int32_t> Greedy(const std::string& address, const std::vector<int32_t>& prompt, int max_new,
                            bool ignore_eos = true) {
  auto stub = v1::RolloutService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::GenerateRequest request;
  request.set_request_id("greedy");
  for (int32_t t : prompt) request.add_prompt_token_ids(t);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_max_new_tokens(max_new);
  request.mutable_sampling()->set_ignore_eos(ignore_eos);
  auto context = Context();
  auto reader = stub->Generate(context.get(), request);
  std::vector<int32_t> tokens;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (response.has_chunk()) {
      for (int32_t t : response.chunk().token_ids()) tokens.push_back(t);
    }
  }
  const grpc::Status s = reader->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  return tokens;
}

TEST(ModelDir, RolloutAndTrainerRunAHuggingFaceCheckpoint) {
  const std::string model = Fixture("qwen2");
  auto expected = model::ReadSafetensors(model + "/expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  const model::TensorBlob& greedy = expected->at("greedy");  // [2, 28] I64
  const int64_t* g = reinterpret_cast<const int64_t*>(greedy.bytes.data());
  const std::vector<int32_t> prompt(g, g + 12), want(g + 12, g + 28);

  const std::string tmp = std::getenv("TEST_TMPDIR");
  const std::string publish = tmp + "/published", checkpoints = tmp + "/checkpoints", with_tokenizer = tmp + "/model";
  fs::create_directories(publish);
  // The model directory with a tokenizer.json beside it (its files go into checkpoints).
  fs::create_directories(with_tokenizer);
  for (const auto& entry : fs::directory_iterator(model)) {
    fs::copy_file(entry.path(), fs::path(with_tokenizer) / entry.path().filename());
  }
  fs::copy_file(testing::RunfilePath("libs/model/testdata/hf/tokenizer_qwen2/tokenizer.json"),
                fs::path(with_tokenizer) / "tokenizer.json");

  Subprocess rollout, trainer;
  auto r = testing::StartService(rollout, "services/rollout/rlfleet-rollout",
                                 {"--threads=1", "--model_dir=" + with_tokenizer, "--publish_dir=" + publish});
  auto t = testing::StartService(trainer, "services/trainer/rlfleet-trainer",
                                 {"--threads=1", "--model_dir=" + with_tokenizer, "--max_seq_len=64",
                                  "--publish_dir=" + publish, "--checkpoint_root=" + checkpoints});
  ASSERT_TRUE(r.ok() && t.ok()) << rollout.output() << trainer.output();
  EXPECT_TRUE(absl::StrContains(rollout.output(), "qwen2 from")) << rollout.output();

  // The replica serves the directory's weights: transformers' greedy tokens.
  EXPECT_EQ(Greedy(*r, prompt, 16), want);

  // The trainer starts from the same weights: a step, a version the replica installs.
  auto trainer_stub = v1::TrainerService::NewStub(grpc::CreateChannel(*t, grpc::InsecureChannelCredentials()));
  v1::TrainStepRequest step;
  for (int i = 0; i < 4; ++i) {
    v1::Experience* e = step.mutable_inline_batch()->add_experiences();
    e->mutable_experience_id()->set_value(absl::StrCat("e", i));
    e->set_group_id("g");
    for (int32_t token : prompt) e->add_prompt_token_ids(token);
    for (int j = 0; j < 3 + i; ++j) {
      e->add_response_token_ids(want[j]);
      e->add_response_logprobs(-1.0f);
    }
    e->set_reward(static_cast<float>(i % 2));
  }
  step.mutable_params()->mutable_optimizer()->set_learning_rate(5e-3f);
  v1::TrainStepResponse stepped;
  grpc::Status s = trainer_stub->TrainStep(Context().get(), step, &stepped);
  ASSERT_TRUE(s.ok()) << s.error_message() << trainer.output();
  EXPECT_GT(stepped.metrics().tokens(), 0u);
  v1::PublishWeightsResponse published;
  s = trainer_stub->PublishWeights(Context().get(), {}, &published);
  ASSERT_TRUE(s.ok()) << s.error_message();
  // A published version is a Hugging Face directory too, holding what was published.
  const fs::path version_dir = fs::path(published.location().segment().worker_address()).parent_path();
  EXPECT_EQ(version_dir, fs::path(publish) / absl::StrCat("policy-v", published.manifest().version().version()));
  for (const char* file : {"config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_TRUE(fs::exists(version_dir / file)) << file;
  }
  auto published_model = model::LoadHfModel(version_dir.string(), {});
  ASSERT_TRUE(published_model.ok()) << published_model.status();
  auto rollout_stub = v1::RolloutService::NewStub(grpc::CreateChannel(*r, grpc::InsecureChannelCredentials()));
  v1::PrepareWeightsRequest update;
  *update.mutable_manifest() = published.manifest();
  *update.add_chunks()->mutable_source() = published.location();
  v1::CommitWeightsResponse committed;
  s = rollout_stub->UpdateWeights(Context().get(), update, &committed);
  ASSERT_TRUE(s.ok()) << s.error_message() << rollout.output();
  v1::GetInfoResponse info;
  ASSERT_TRUE(rollout_stub->GetInfo(Context().get(), {}, &info).ok());
  EXPECT_EQ(info.installed_version().version(), published.manifest().version().version());

  // A checkpoint is a Hugging Face directory: it loads as one, with the trained weights.
  v1::SaveCheckpointRequest save;
  save.set_path("step1");
  v1::SaveCheckpointResponse saved;
  s = trainer_stub->SaveCheckpoint(Context().get(), save, &saved);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::string dir = saved.path();
  for (const char* file : {"config.json", "model.safetensors", "tokenizer.json", "state.txt"}) {
    EXPECT_TRUE(fs::exists(fs::path(dir) / file)) << file;
  }
  EXPECT_FALSE(fs::exists(fs::path(dir) / "weights.safetensors"));
  // Its config.json keeps every key of the source's (max_position_embeddings, not the
  // trainer's --max_seq_len; token ids; ...) but the ones it spells both ways.
  const nlohmann::json source = nlohmann::json::parse(std::ifstream(with_tokenizer + "/config.json"));
  const nlohmann::json written = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  for (const auto& [key, value] : source.items()) {
    if (key == "rope_parameters" || key == "rope_scaling" || key == "rope_theta" || key == "dtype" ||
        key == "torch_dtype") {
      continue;
    }
    EXPECT_EQ(written.value(key, nlohmann::json()), value) << key;
  }
  EXPECT_EQ(written["max_position_embeddings"], 256);
  auto trained = model::LoadHfModel(dir, {});
  auto original = model::LoadHfModel(model, {});
  ASSERT_TRUE(trained.ok() && original.ok()) << trained.status();
  EXPECT_EQ(model::HfConfigJson((*trained)->config()), model::HfConfigJson((*original)->config()));
  EXPECT_NE((*trained)->SafetensorsBytes(), (*original)->SafetensorsBytes());
  EXPECT_EQ((*trained)->SafetensorsBytes(), (*published_model)->SafetensorsBytes());
  // ... and the trainer loads it back, and overwrites it.
  v1::LoadCheckpointRequest load;
  load.set_path("step1");
  v1::LoadCheckpointResponse loaded;
  s = trainer_stub->LoadCheckpoint(Context().get(), load, &loaded);
  EXPECT_TRUE(s.ok()) << s.error_message();
  save.set_overwrite(true);
  s = trainer_stub->SaveCheckpoint(Context().get(), save, &saved);
  EXPECT_TRUE(s.ok()) << s.error_message();

  for (Subprocess* p : {&rollout, &trainer}) {
    ASSERT_TRUE(p->Signal(SIGTERM).ok());
    EXPECT_TRUE(p->Wait(absl::Seconds(30)).ok());
  }
}

// A sequence ends on any end-of-sequence id the directory names (generation_config.json
// here), not on the built-in tokenizer's EOS.
TEST(ModelDir, SequencesEndOnTheModelsEosIds) {
  const std::string model = Fixture("qwen2");
  auto expected = model::ReadSafetensors(model + "/expected.safetensors");
  ASSERT_TRUE(expected.ok());
  const int64_t* g = reinterpret_cast<const int64_t*>(expected->at("greedy").bytes.data());
  const std::vector<int32_t> prompt(g, g + 12);
  const int32_t first = static_cast<int32_t>(g[12]);  // transformers' first greedy token
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/eos_model";
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(model))
    fs::copy_file(entry.path(), fs::path(dir) / entry.path().filename());
  std::ofstream(dir + "/generation_config.json") << "{\"eos_token_id\": [95, " << first << "]}";
  Subprocess rollout;
  auto r = testing::StartService(rollout, "services/rollout/rlfleet-rollout", {"--threads=1", "--model_dir=" + dir});
  ASSERT_TRUE(r.ok()) << rollout.output();
  EXPECT_TRUE(absl::StrContains(rollout.output(), absl::StrCat("end of sequence 95, ", first))) << rollout.output();
  EXPECT_EQ(Greedy(*r, prompt, 16, /*ignore_eos=*/false), std::vector<int32_t>({first}));
  EXPECT_EQ(Greedy(*r, prompt, 16, /*ignore_eos=*/true).size(), 16u);
  ASSERT_TRUE(rollout.Signal(SIGTERM).ok());
  EXPECT_TRUE(rollout.Wait(absl::Seconds(30)).ok());
}

// PPO on a pretrained directory: a trainer with --value_head (its critic head starts at
// zero) takes GAE steps; the versions it publishes carry the head, and a replica of the
// plain model installs them.
TEST(ModelDir, ATrainerWithAValueHeadRunsPpoOnACheckpoint) {
  const std::string model = Fixture("qwen2");
  const std::string publish = std::string(std::getenv("TEST_TMPDIR")) + "/published-ppo";
  fs::create_directories(publish);
  Subprocess rollout, trainer;
  auto r = testing::StartService(rollout, "services/rollout/rlfleet-rollout",
                                 {"--threads=1", "--model_dir=" + model, "--publish_dir=" + publish});
  auto t = testing::StartService(trainer, "services/trainer/rlfleet-trainer",
                                 {"--threads=1", "--model_dir=" + model, "--value_head", "--publish_dir=" + publish});
  ASSERT_TRUE(r.ok() && t.ok()) << rollout.output() << trainer.output();
  auto trainer_stub = v1::TrainerService::NewStub(grpc::CreateChannel(*t, grpc::InsecureChannelCredentials()));
  v1::TrainStepRequest step;
  for (int i = 0; i < 4; ++i) {
    v1::Experience* e = step.mutable_inline_batch()->add_experiences();
    e->mutable_experience_id()->set_value(absl::StrCat("p", i));
    e->set_group_id("g");
    for (int32_t token : {1, 2, 3, 4}) e->add_prompt_token_ids(token);
    for (int j = 0; j < 2 + i; ++j) {
      e->add_response_token_ids(5 + j);
      e->add_response_logprobs(-1.0f);
    }
    e->set_reward(static_cast<float>(i % 2));
  }
  step.mutable_params()->set_algorithm(v1::ALGORITHM_PPO);
  for (int k = 0; k < 2; ++k) {
    v1::TrainStepResponse stepped;
    grpc::Status s = trainer_stub->TrainStep(Context().get(), step, &stepped);
    ASSERT_TRUE(s.ok()) << s.error_message() << trainer.output();
    EXPECT_GT(stepped.metrics().value_loss(), 0.0f) << "step " << k;
  }
  v1::PublishWeightsResponse published;
  ASSERT_TRUE(trainer_stub->PublishWeights(Context().get(), {}, &published).ok());
  auto rollout_stub = v1::RolloutService::NewStub(grpc::CreateChannel(*r, grpc::InsecureChannelCredentials()));
  v1::PrepareWeightsRequest update;
  *update.mutable_manifest() = published.manifest();
  *update.add_chunks()->mutable_source() = published.location();
  v1::CommitWeightsResponse committed;
  grpc::Status s = rollout_stub->UpdateWeights(Context().get(), update, &committed);
  ASSERT_TRUE(s.ok()) << s.error_message() << rollout.output();
  ASSERT_TRUE(trainer.Signal(SIGTERM).ok());
  ASSERT_TRUE(rollout.Signal(SIGTERM).ok());
  EXPECT_TRUE(trainer.Wait(absl::Seconds(30)).ok());
  EXPECT_TRUE(rollout.Wait(absl::Seconds(30)).ok());
}

TEST(ModelDir, ConflictingFlagsAndBadDirectoriesAreRefused) {
  struct Case {
    const char* binary;
    std::vector<std::string> flags;
    const char* says;
  };
  const std::string model = Fixture("qwen3");
  const std::vector<Case> cases = {
      {"services/rollout/rlfleet-rollout", {"--model_dir=" + model, "--d_model=256"}, "--d_model with --model_dir"},
      {"services/rollout/rlfleet-rollout", {"--model_dir=/nonexistent"}, "config.json"},
      {"services/rollout/rlfleet-rollout", {"--model_dir=" + model, "--serve_initial_weights"}, "drop --weights"},
      {"services/trainer/rlfleet-trainer", {"--model_dir=" + model, "--n_layers=2"}, "--n_layers with --model_dir"},
      {"services/trainer/rlfleet-trainer", {"--model_dir=" + Fixture("tokenizer_qwen2")}, "config.json"},
  };
  for (const Case& c : cases) {
    Subprocess p;
    std::vector<std::string> argv = {testing::RunfilePath(c.binary), "--host=127.0.0.1", "--port=0"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    ASSERT_TRUE(p.Start(argv).ok());
    auto exit = p.Wait(absl::Seconds(30));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_EQ(WEXITSTATUS(*exit), 2) << c.says;
    EXPECT_TRUE(absl::StrContains(p.output(), c.says)) << p.output();
  }
}

// `rlfleet tokenize`: the tokenizers library's ids for a chat-like text, and the text
// back; a directory without a tokenizer is an error naming the file.
TEST(ModelDir, RlfleetTokenizePrintsTheIdsAndTheTextBack) {
  auto run = [](const std::vector<std::string>& args) {
    Subprocess cli;
    std::vector<std::string> argv = {testing::RunfilePath("services/controller/rlfleet"), "tokenize"};
    argv.insert(argv.end(), args.begin(), args.end());
    EXPECT_TRUE(cli.Start(argv).ok());
    auto status = cli.Wait(absl::Seconds(30));
    EXPECT_TRUE(status.ok());
    return std::make_pair(status.ok() ? WEXITSTATUS(*status) : -1, cli.output());
  };
  const std::string dir = Fixture("tokenizer_qwen2");
  // (expected.json's case 9: a chat in Qwen's template, special tokens inside)
  const std::string text =
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  auto [rc, out] = run({"--model_dir=" + dir, "--text=" + text});
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(absl::StartsWith(out, "[1, 85, 91, 269, 445, 201, 59, 569, 828, 71, 223, 74,")) << out;
  std::string ids = out.substr(1, out.find(']') - 1);
  ids.erase(std::remove(ids.begin(), ids.end(), ' '), ids.end());
  auto [rc2, back] = run({"--model_dir=" + dir, "--ids=" + ids});
  EXPECT_EQ(rc2, 0) << back;
  EXPECT_EQ(back, text + "\n");
  auto [rc3, missing] = run({"--model_dir=" + Fixture("qwen2"), "--text=x"});
  EXPECT_EQ(rc3, 1);
  EXPECT_TRUE(absl::StrContains(missing, "tokenizer.json")) << missing;
}

}  // namespace
}  // namespace rlfleet

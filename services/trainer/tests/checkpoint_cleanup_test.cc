// A trainer killed at any phase of SaveCheckpoint leaves nothing behind once it is
// restarted (CleanCheckpointRoot at start), nor after its next save; cleaning never
// touches a complete checkpoint, another owner's directories or files no save writes.
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "libs/model/test_util.h"
#include "libs/model/tokenizer.h"
#include "services/trainer/checkpoint.h"
#include "services/trainer/trainer_core.h"

namespace rlfleet::trainer {
namespace {

namespace fs = std::filesystem;

std::string Root(const std::string& name) { return absl::StrCat(getenv("TEST_TMPDIR"), "/", name); }

std::unique_ptr<TrainerCore> Trainer(const std::string& root, const std::string& owner = kDefaultCheckpointOwner) {
  auto core = TrainerCore::Create(model::TinyConfig(), model::TestDevice(), 1, nullptr, nullptr, root, owner);
  EXPECT_TRUE(core.ok()) << core.status();
  return std::move(*core);
}

// One inline step, so that the optimizer has state to save.
void Step(TrainerCore* core) {
  v1::TrainStepRequest request;
  for (int i = 0; i < 4; ++i) {
    v1::Experience* e = request.mutable_inline_batch()->add_experiences();
    e->mutable_experience_id()->set_value(absl::StrCat("e", i));
    e->set_group_id("g");
    const auto prompt = model::Tokenizer::EncodePrompt("reverse:12");  // (kept alive for the loops)
    const auto answer = model::Tokenizer::EncodeResponse("21");
    for (int32_t t : *prompt) e->add_prompt_token_ids(t);
    for (int32_t t : *answer) {
      e->add_response_token_ids(t);
      e->add_response_logprobs(-3.0f);
      e->add_token_policy_versions(1);
    }
    e->set_reward(i % 2);
  }
  v1::TrainStepResponse response;
  const absl::Status s = core->TrainStep(request, &response);
  ASSERT_TRUE(s.ok()) << s;
}

absl::Status Save(TrainerCore* core, const std::string& path, bool overwrite = false) {
  v1::SaveCheckpointRequest save;
  save.set_path(path);
  save.set_overwrite(overwrite);
  v1::SaveCheckpointResponse saved;
  return core->SaveCheckpoint(save, &saved);
}

// The step of the checkpoint at `path`, or 0 when none loads.
uint64_t StepOf(TrainerCore* core, const std::string& path) {
  v1::LoadCheckpointRequest load;
  load.set_path(path);
  v1::LoadCheckpointResponse loaded;
  return core->LoadCheckpoint(load, &loaded).ok() ? loaded.step() : 0;
}

// Every entry under `root` whose name holds ".tmp-" or ".old-" (a save's directories).
std::vector<std::string> Leftovers(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos) {
      out.push_back(it->path().string());
    }
  }
  return out;
}

const char* Name(SavePhase phase) {
  switch (phase) {
    case SavePhase::kTmpCreated:
      return "tmp_created";
    case SavePhase::kWeightsWritten:
      return "weights_written";
    case SavePhase::kFilesWritten:
      return "files_written";
    case SavePhase::kOldMovedAside:
      return "old_moved_aside";
    case SavePhase::kRenamed:
      return "renamed";
  }
  return "?";
}

TEST(CheckpointCleanup, AKillAtEveryPhaseOfASaveLeavesNothingAfterTheRestart) {
  for (bool overwrite : {false, true}) {
    for (SavePhase phase : {SavePhase::kTmpCreated, SavePhase::kWeightsWritten, SavePhase::kFilesWritten,
                            SavePhase::kOldMovedAside, SavePhase::kRenamed}) {
      if (phase == SavePhase::kOldMovedAside && !overwrite) continue;  // (only an overwrite moves one aside)
      SCOPED_TRACE(absl::StrCat(Name(phase), overwrite ? ", overwrite" : ", new checkpoint"));
      const std::string root = Root(absl::StrCat("kill-", Name(phase), overwrite ? "-overwrite" : ""));
      uint64_t killed_step = 0;
      {
        std::unique_ptr<TrainerCore> trainer = Trainer(root);
        Step(trainer.get());
        ASSERT_TRUE(Save(trainer.get(), "run/step-a").ok());  // step 1, complete
        if (overwrite) ASSERT_TRUE(Save(trainer.get(), "run/step-b").ok());
        Step(trainer.get());
        killed_step = 2;
        trainer->SetSaveFaultForTest([phase](SavePhase at) { return at == phase; });
        const absl::Status killed = Save(trainer.get(), "run/step-b", overwrite);
        ASSERT_EQ(killed.code(), absl::StatusCode::kAborted) << killed;
        if (phase == SavePhase::kWeightsWritten) {
          // (killed while writing the optimizer state: WriteFileAtomically's file too)
          for (const std::string& dir : Leftovers(root)) std::ofstream(dir + "/optimizer.safetensors.tmp") << "par";
        }
      }  // (the trainer is gone, as a killed one is)
      const std::vector<std::string> left = Leftovers(root);
      if (phase != SavePhase::kRenamed || overwrite) {
        EXPECT_FALSE(left.empty()) << "the kill left nothing to clean: the phase is not simulated";
      }
      std::unique_ptr<TrainerCore> restarted = Trainer(root);
      const std::vector<std::string> lines = restarted->CleanCheckpointRoot();
      EXPECT_EQ(lines.size(), left.size()) << absl::StrJoin(lines, "\n");
      for (const std::string& line : lines) {
        EXPECT_TRUE(absl::StartsWith(line, "removed ") || absl::StartsWith(line, "restored ")) << line;
      }
      EXPECT_TRUE(Leftovers(root).empty()) << absl::StrJoin(Leftovers(root), "\n");
      // The complete checkpoint is untouched; the interrupted one is as before the save,
      // or the new one when the kill came after its rename.
      EXPECT_EQ(StepOf(restarted.get(), "run/step-a"), 1u);
      const uint64_t b = StepOf(restarted.get(), "run/step-b");
      if (phase == SavePhase::kRenamed) {
        EXPECT_EQ(b, killed_step);
      } else if (overwrite) {
        EXPECT_EQ(b, 1u);  // (kOldMovedAside: restored from .old-)
      } else {
        EXPECT_EQ(b, 0u);
        EXPECT_FALSE(fs::exists(root + "/run/step-b"));
      }
      v1::LoadCheckpointResponse loaded;
      EXPECT_TRUE(restarted->ResumeLatest(&loaded).ok());
    }
  }
}

TEST(CheckpointCleanup, NeverTouchesAnotherOwnersDirectoriesACompleteCheckpointOrFilesNoSaveWrites) {
  const std::string root = Root("strangers");
  std::unique_ptr<TrainerCore> trainer = Trainer(root, "run_a");
  ASSERT_TRUE(Save(trainer.get(), "ckpt").ok());
  // Another run's save in progress, an older format's, a complete checkpoint whose name
  // looks like a save directory of ours but of another owner, and ours with a stranger's
  // file in it; and a link named like ours to a directory elsewhere.
  fs::copy(root + "/ckpt", root + "/ckpt.tmp-run_b-100");
  fs::copy(root + "/ckpt", root + "/ckpt.tmp-12345");
  fs::copy(root + "/ckpt", root + "/x.old-run_ab-7");
  fs::copy(root + "/ckpt", root + "/y.tmp-run_a-8");
  std::ofstream(root + "/y.tmp-run_a-8/notes.txt") << "not a checkpoint file";
  fs::create_directories(Root("elsewhere"));
  std::ofstream(Root("elsewhere") + "/weights.safetensors") << "precious";
  fs::create_directory_symlink(Root("elsewhere"), root + "/z.tmp-run_a-9");
  fs::create_directories(root + "/deep/er");
  fs::copy(root + "/ckpt", root + "/deep/er/w.tmp-run_a-10");  // (nested: removed)

  const std::vector<std::string> lines = trainer->CleanCheckpointRoot();
  EXPECT_EQ(lines.size(), 2u) << absl::StrJoin(lines, "\n");
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(lines, "\n"), "left " + root + "/y.tmp-run_a-8")) << lines[0];
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(lines, "\n"), "removed " + root + "/deep/er/w.tmp-run_a-10"));
  for (const char* kept : {"ckpt", "ckpt.tmp-run_b-100", "ckpt.tmp-12345", "x.old-run_ab-7", "y.tmp-run_a-8/notes.txt",
                           "y.tmp-run_a-8/state.txt", "z.tmp-run_a-9"}) {
    EXPECT_TRUE(fs::exists(fs::symlink_status(root + "/" + kept))) << kept;
  }
  EXPECT_TRUE(fs::exists(Root("elsewhere") + "/weights.safetensors"));
  EXPECT_FALSE(fs::exists(root + "/deep/er/w.tmp-run_a-10"));
  v1::LoadCheckpointRequest load;
  load.set_path("ckpt");
  v1::LoadCheckpointResponse loaded;
  EXPECT_TRUE(trainer->LoadCheckpoint(load, &loaded).ok());
  // An owner outside the alphabet is refused at creation.
  EXPECT_EQ(
      TrainerCore::Create(model::TinyConfig(), model::TestDevice(), 1, nullptr, nullptr, root, "../x").status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointCleanup, ASuccessfulSaveRemovesWhatEarlierInterruptedSavesLeft) {
  const std::string root = Root("after-save");
  std::unique_ptr<TrainerCore> trainer = Trainer(root);
  trainer->SetSaveFaultForTest([](SavePhase at) { return at == SavePhase::kWeightsWritten; });
  EXPECT_EQ(Save(trainer.get(), "step-1").code(), absl::StatusCode::kAborted);
  ASSERT_EQ(Leftovers(root).size(), 1u);
  trainer->SetSaveFaultForTest({});
  ASSERT_TRUE(Save(trainer.get(), "step-2").ok());
  EXPECT_TRUE(Leftovers(root).empty()) << absl::StrJoin(Leftovers(root), "\n");
  EXPECT_TRUE(fs::exists(root + "/step-2/state.txt"));
}

// A save that fails on a full disk (here: a file-size limit, EFBIG) removes its own
// directory, the half-written file included.
TEST(CheckpointCleanup, ASaveThatFailsOnAFullDiskLeavesNothing) {
  const std::string root = Root("full-disk");
  std::unique_ptr<TrainerCore> trainer = Trainer(root);
  Step(trainer.get());
  signal(SIGXFSZ, SIG_IGN);
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  rlimit small = before;
  small.rlim_cur = 4096;  // (the weights alone are larger)
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status full = Save(trainer.get(), "step-1");
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &before), 0);
  EXPECT_FALSE(full.ok());
  EXPECT_TRUE(Leftovers(root).empty()) << absl::StrJoin(Leftovers(root), "\n");
  EXPECT_FALSE(fs::exists(root + "/step-1"));
}

}  // namespace
}  // namespace rlfleet::trainer

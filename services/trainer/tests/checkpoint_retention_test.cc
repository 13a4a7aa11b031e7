// SaveCheckpointRequest.keep_last: after each save the trainer keeps exactly the newest
// keep_last checkpoints of the saved series (<name>-step-<N>), the one just saved always
// among them, and never removes another series', a save's working directory or a
// directory that is not a checkpoint.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/model/test_util.h"
#include "services/trainer/checkpoint.h"
#include "services/trainer/trainer_core.h"

namespace rlfleet::trainer {
namespace {

namespace fs = std::filesystem;

std::string Root(const std::string& name) { return absl::StrCat(getenv("TEST_TMPDIR"), "/", name); }

std::unique_ptr<TrainerCore> Trainer(const std::string& root) {
  auto core =
      TrainerCore::Create(model::TinyConfig(), model::TestDevice(), 1, nullptr, nullptr, root, kDefaultCheckpointOwner);
  EXPECT_TRUE(core.ok()) << core.status();
  return std::move(*core);
}

absl::StatusOr<v1::SaveCheckpointResponse> Save(TrainerCore* core, const std::string& path, uint32_t keep_last,
                                                bool overwrite = false) {
  v1::SaveCheckpointRequest save;
  save.set_path(path);
  save.set_keep_last(keep_last);
  save.set_overwrite(overwrite);
  v1::SaveCheckpointResponse saved;
  absl::Status s = core->SaveCheckpoint(save, &saved);
  if (!s.ok()) return s;
  return saved;
}

// The names of the entries of `dir`, sorted.
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(CheckpointRetentionTest, KeepsExactlyTheLastN) {
  const std::string root = Root("keep3");
  auto core = Trainer(root);
  for (int step = 1; step <= 6; ++step) {
    auto saved = Save(core.get(), absl::StrCat("runs/a-step-", step), 3);
    ASSERT_TRUE(saved.ok()) << saved.status();
    EXPECT_EQ(saved->pruned_size(), step > 3 ? 1 : 0) << step;
    std::vector<std::string> want;
    for (int k = std::max(1, step - 2); k <= step; ++k) want.push_back(absl::StrCat("a-step-", k));
    std::sort(want.begin(), want.end());
    EXPECT_EQ(Names(root + "/runs"), want) << "after step " << step;
  }
}

TEST(CheckpointRetentionTest, ZeroKeepsAll) {
  const std::string root = Root("keep0");
  auto core = Trainer(root);
  for (int step = 1; step <= 4; ++step) ASSERT_TRUE(Save(core.get(), absl::StrCat("a-step-", step), 0).ok());
  EXPECT_EQ(Names(root).size(), 4u);
}

TEST(CheckpointRetentionTest, TheSavedOneStaysEvenWhenOlderThanTheOthers) {
  // A run resumed from an older checkpoint saves a lower step than some already there:
  // the one it just saved (what it would resume from) is never pruned.
  const std::string root = Root("older");
  auto core = Trainer(root);
  ASSERT_TRUE(Save(core.get(), "a-step-10", 0).ok());
  ASSERT_TRUE(Save(core.get(), "a-step-20", 0).ok());
  auto saved = Save(core.get(), "a-step-4", 1);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(Names(root), std::vector<std::string>({"a-step-4"}));
  saved = Save(core.get(), "a-step-5", 2);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(Names(root), std::vector<std::string>({"a-step-4", "a-step-5"}));
}

TEST(CheckpointRetentionTest, OtherSeriesAndOtherDirectoriesStay) {
  const std::string root = Root("others");
  auto core = Trainer(root);
  ASSERT_TRUE(Save(core.get(), "b-step-1", 0).ok());         // another run
  ASSERT_TRUE(Save(core.get(), "a-x-step-1", 0).ok());       // another run whose id starts like ours
  ASSERT_TRUE(Save(core.get(), "a-step-1-step-2", 0).ok());  // another run, id "a-step-1"
  ASSERT_TRUE(Save(core.get(), "sub/a-step-1", 0).ok());     // ours, another folder
  fs::create_directories(root + "/a-step-0");                // not a checkpoint
  std::ofstream(root + "/a-step-0/notes.txt") << "mine";
  fs::create_directories(root + "/a-step-1.tmp-other-5");  // another owner's save
  std::ofstream(root + "/a-step-1.tmp-other-5/state.txt") << "x";
  std::ofstream(root + "/a-step-7") << "a file, not a directory";
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE(Save(core.get(), absl::StrCat("a-step-", step), 1).ok());
  EXPECT_EQ(Names(root), std::vector<std::string>({"a-step-0", "a-step-1-step-2", "a-step-1.tmp-other-5", "a-step-3",
                                                   "a-step-7", "a-x-step-1", "b-step-1", "sub"}));
  EXPECT_EQ(Names(root + "/sub"), std::vector<std::string>({"a-step-1"}));
}

TEST(CheckpointRetentionTest, RefusedBeforeWriting) {
  const std::string root = Root("refused");
  auto core = Trainer(root);
  EXPECT_EQ(Save(core.get(), "final", 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Save(core.get(), "a-step-", 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Save(core.get(), "a-step-1", kMaxKeepLast + 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Names(root).empty());
  EXPECT_TRUE(Save(core.get(), "final", 0).ok());  // (no retention: any name)
}

TEST(CheckpointRetentionTest, ParseSeriesName) {
  auto parsed = ParseSeriesName("run-1-step-12");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->name, "run-1");
  EXPECT_EQ(parsed->step, 12u);
  parsed = ParseSeriesName("a-step-1-step-2");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->name, "a-step-1");
  for (const char* bad : {"-step-1", "a-step-", "a-step-+1", "a-step-1x", "a-step-1.tmp-trainer-5", "a-step--1",
                          "a-step-12345678901234567890", "astep-1"}) {
    EXPECT_FALSE(ParseSeriesName(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace rlfleet::trainer

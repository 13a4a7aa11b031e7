#include "libs/common/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace rlfleet::common {
namespace {
namespace fs = std::filesystem;

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rlfleet_files_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    root_ = dir_ / "root";
    fs::create_directories(root_ / "sub");
    std::ofstream(root_ / "sub" / "w.bin") << "0123456789";
    std::ofstream(dir_ / "secret.txt") << "do not read";
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_, root_;
};

TEST(PathIdTest, DotNamesAreRefused) {
  EXPECT_TRUE(ValidatePathId("run_id", "run-1.v2").ok());
  EXPECT_FALSE(ValidatePathId("run_id", "..").ok());
  EXPECT_FALSE(ValidatePathId("run_id", ".").ok());
  EXPECT_FALSE(ValidatePathId("run_id", ".hidden").ok());
  EXPECT_FALSE(ValidatePathId("run_id", "a/b").ok());
  EXPECT_FALSE(ValidatePathId("run_id", "x'; touch /tmp/pwned; '").ok());
  EXPECT_FALSE(ValidatePathId("run_id", "").ok());
}

TEST_F(FilesTest, PathsResolveInsideTheRootOnly) {
  absl::StatusOr<fs::path> inside = ResolveUnderRoot("path", root_, "sub/w.bin");
  ASSERT_TRUE(inside.ok()) << inside.status();
  EXPECT_EQ(*inside, fs::canonical(root_ / "sub" / "w.bin"));
  EXPECT_TRUE(ResolveUnderRoot("path", root_, (root_ / "sub" / "new.bin").string()).ok());
  EXPECT_TRUE(ResolveUnderRoot("path", root_, "not/yet/there").ok());

  for (const std::string& bad : std::vector<std::string>{"../secret.txt", "sub/../../secret.txt", "/etc/passwd",
                                                         "/dev/zero", (dir_ / "rootx").string()}) {
    absl::StatusOr<fs::path> r = ResolveUnderRoot("path", root_, bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("outside"), absl::string_view::npos) << r.status();
  }
  fs::create_symlink(dir_, root_ / "link");
  EXPECT_FALSE(ResolveUnderRoot("path", root_, "link/secret.txt").ok()) << "a symlink leads out";
  EXPECT_EQ(ResolveUnderRoot("path", "", "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FilesTest, OnlyRegularFilesOfBoundedSizeAreRead) {
  absl::StatusOr<std::string> ok = ReadRegularFile("f", root_ / "sub" / "w.bin", 10);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "0123456789");
  EXPECT_EQ(ReadRegularFile("f", root_ / "sub" / "w.bin", 9).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadRegularFile("f", root_, 1 << 20).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadRegularFile("f", "/dev/zero", 1 << 20).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(::mkfifo((root_ / "fifo").c_str(), 0600), 0);
  // A FIFO with no writer: opening must not block, and it is refused.
  EXPECT_EQ(ReadRegularFile("f", root_ / "fifo", 1 << 20).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadRegularFile("f", root_ / "missing", 1).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<uint64_t> size = RegularFileSize("f", root_ / "sub" / "w.bin", 100);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 10u);
}

TEST_F(FilesTest, ProgramsRunWithoutAShell) {
  // An argument full of shell syntax is one argument: nothing is executed from it.
  const fs::path marker = dir_ / "pwned";
  ASSERT_TRUE(RunProgram({"true", absl::StrCat("'; touch ", marker.string(), "; '")}, absl::Seconds(10)).ok());
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_TRUE(RunProgram({"touch", marker.string()}, absl::Seconds(10)).ok());
  EXPECT_TRUE(fs::exists(marker));
  EXPECT_EQ(RunProgram({"false"}, absl::Seconds(10)).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(RunProgram({"no-such-program-rlfleet"}, absl::Seconds(10)).code(), absl::StatusCode::kNotFound);
  const absl::Time start = absl::Now();
  EXPECT_EQ(RunProgram({"sleep", "30"}, absl::Milliseconds(200)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace rlfleet::common

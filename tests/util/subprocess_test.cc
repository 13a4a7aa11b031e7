// Subprocess: the child's output is drained whether or not the test reads it, lines
// are matched in order, and an exit before the line is an error.
#include "tests/util/subprocess.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace rlfleet::testing {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// A child printing far more than a pipe holds (64 KiB) goes on while the test reads
// nothing: it reaches the marker it touches after printing.
TEST(Subprocess, AChattyChildNeverBlocksOnAnUnreadPipe) {
  const std::string marker = absl::StrCat(getenv("TEST_TMPDIR"), "/printed");
  Subprocess child;
  ASSERT_TRUE(child
                  .Start({"/bin/sh", "-c",
                          absl::StrCat("head -c 1000000 /dev/zero | tr '\\0' x; echo; touch ", marker,
                                       "; read line; echo bye")})
                  .ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!Exists(marker) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(Exists(marker)) << "the child blocked writing to its pipe";
  ASSERT_TRUE(child.WriteLine("go").ok());
  auto bye = child.WaitForLine([](const std::string& l) { return l == "bye"; }, absl::Seconds(20));
  ASSERT_TRUE(bye.ok()) << bye.status().message().substr(0, 200);
  auto status = child.Wait(absl::Seconds(20));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  EXPECT_GE(child.output().size(), 1000000u);
}

TEST(Subprocess, LinesAreMatchedInOrderAndAnExitBeforeTheLineIsAnError) {
  Subprocess child;
  ASSERT_TRUE(child.Start({"/bin/sh", "-c", "echo one; echo two; echo three"}).ok());
  auto two = child.WaitForLine([](const std::string& l) { return absl::StartsWith(l, "t"); }, absl::Seconds(20));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, "two");
  auto three = child.WaitForLine([](const std::string& l) { return absl::StartsWith(l, "t"); }, absl::Seconds(20));
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(*three, "three");
  auto four = child.WaitForLine([](const std::string& l) { return l == "four"; }, absl::Seconds(20));
  EXPECT_EQ(four.status().code(), absl::StatusCode::kFailedPrecondition) << four.status();
  EXPECT_TRUE(absl::StrContains(four.status().message(), "one\ntwo\nthree")) << four.status();
  ASSERT_TRUE(child.Wait(absl::Seconds(20)).ok());
}

TEST(Subprocess, ALineThatNeverComesIsADeadlineAndTheChildIsKilledAtTheEnd) {
  Subprocess child;
  ASSERT_TRUE(child.Start({"/bin/sh", "-c", "echo started; read line"}).ok());
  auto never = child.WaitForLine([](const std::string& l) { return l == "never"; }, absl::Milliseconds(300));
  EXPECT_EQ(never.status().code(), absl::StatusCode::kDeadlineExceeded) << never.status();
  EXPECT_TRUE(absl::StrContains(never.status().message(), "started")) << never.status();
  auto waited = child.Wait(absl::Milliseconds(200));
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kDeadlineExceeded) << waited.status();
  EXPECT_EQ(child.pid(), -1);
}

}  // namespace
}  // namespace rlfleet::testing

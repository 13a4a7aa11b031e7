#include "libs/common/status_macros.h"

#include <string>

#include "gtest/gtest.h"

namespace rlfleet::common {
namespace {

int g_calls = 0;

absl::Status CountedError() {
  ++g_calls;
  return absl::NotFoundError("missing");
}

absl::Status UsesReturnIfError(bool fail) {
  if (fail) RETURN_IF_ERROR(CountedError());
  RETURN_IF_ERROR(absl::OkStatus());
  return absl::InternalError("reached the end");
}

absl::StatusOr<std::string> MaybeString(bool ok) {
  if (!ok) return absl::InvalidArgumentError("bad");
  return std::string("value");
}

absl::StatusOr<size_t> UsesAssignOrReturn(bool ok) {
  ASSIGN_OR_RETURN(std::string s, MaybeString(ok));
  size_t n = 0;
  ASSIGN_OR_RETURN(n, absl::StatusOr<size_t>(s.size()));
  return n;
}

TEST(StatusMacros, ReturnIfErrorReturnsTheErrorAndEvaluatesOnce) {
  g_calls = 0;
  absl::Status s = UsesReturnIfError(true);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "missing");
  EXPECT_EQ(g_calls, 1);
  EXPECT_EQ(UsesReturnIfError(false).code(), absl::StatusCode::kInternal);
}

TEST(StatusMacros, AssignOrReturnDeclaresAndAssigns) {
  absl::StatusOr<size_t> ok = UsesAssignOrReturn(true);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 5u);
  absl::StatusOr<size_t> bad = UsesAssignOrReturn(false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "bad");
}

TEST(StatusMacros, AnnotateKeepsCodeAndPrefixesMessage) {
  absl::Status s = Annotate(absl::UnavailableError("down"), "calling rollout-1");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "calling rollout-1: down");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

}  // namespace
}  // namespace rlfleet::common

#include "libs/common/ids.h"

#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace rlfleet::common {
namespace {

TEST(Ids, NewIdHasPrefixAndSixteenHexDigits) {
  const std::string id = NewId("rollout");
  ASSERT_TRUE(absl::StartsWith(id, "rollout-")) << id;
  const std::string hex = id.substr(8);
  ASSERT_EQ(hex.size(), 16u) << id;
  for (char c : hex) EXPECT_TRUE(isxdigit(c) && !isupper(c)) << id;
  EXPECT_TRUE(ValidateId("id", id).ok());
}

TEST(Ids, NewIdsDoNotCollide) {
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(seen.insert(NewId("x")).second);
}

TEST(Ids, ValidateRejectsEmptyLongAndBadCharacters) {
  absl::Status empty = ValidateId("replica_id", "");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(empty.message(), "replica_id")) << empty;

  absl::Status longer = ValidateId("replica_id", std::string(kMaxIdBytes + 1, 'a'));
  EXPECT_EQ(longer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(longer.message(), "limit")) << longer;
  EXPECT_TRUE(ValidateId("replica_id", std::string(kMaxIdBytes, 'a')).ok());

  absl::Status bad = ValidateId("experience_id", "a b");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.message(), "byte 1")) << bad;
  EXPECT_TRUE(ValidateId("experience_id", "run-1:step.2_x").ok());
}

}  // namespace
}  // namespace rlfleet::common

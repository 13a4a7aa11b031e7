#include "libs/common/json_depth.h"

#include <gtest/gtest.h>

#include <string>

namespace rlfleet::common {
namespace {

TEST(JsonDepthTest, CountsBracketsOutsideStringsOnly) {
  EXPECT_TRUE(CheckJsonDepth(R"({"a":[1,{"b":[]}]})", "x", 4).ok());
  EXPECT_FALSE(CheckJsonDepth(R"({"a":[1,{"b":[]}]})", "x", 3).ok());
  EXPECT_TRUE(CheckJsonDepth(R"({"s":"[[[[[[{{{{\"[[["})", "x", 1).ok());
  EXPECT_TRUE(CheckJsonDepth("", "x", 0).ok());
}

TEST(JsonDepthTest, ADeepBombIsRefusedByNameAndOffset) {
  const std::string bomb = std::string(100000, '[') + std::string(100000, ']');
  const absl::Status s = CheckJsonDepth(bomb, "the request body");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the request body"), std::string::npos);
  EXPECT_NE(s.message().find("byte 128"), std::string::npos) << s.message();
  // Siblings do not add up: a long flat array is fine.
  std::string flat = "[";
  for (int i = 0; i < 10000; ++i) flat += "[],";
  flat += "[]]";
  EXPECT_TRUE(CheckJsonDepth(flat, "x", 2).ok());
}

}  // namespace
}  // namespace rlfleet::common

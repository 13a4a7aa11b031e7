#include "libs/common/checks.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace rlfleet::common {
namespace {

TEST(ChecksTest, NanAndInfinityAreRefusedWhereEveryComparisonWouldPassThem) {
  EXPECT_TRUE(CheckFiniteInRange("temperature", 1.0, 0, 100).ok());
  const absl::Status nan = CheckFiniteInRange("temperature", std::nan(""), 0, 100);
  EXPECT_EQ(nan.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nan.message().find("temperature"), absl::string_view::npos) << nan;
  EXPECT_FALSE(CheckFiniteInRange("t", std::numeric_limits<double>::infinity(), 0, 1e300).ok());
  EXPECT_FALSE(CheckFiniteInRange("t", -0.5, 0, 1).ok());
  EXPECT_FALSE(CheckFinite("reward", -std::numeric_limits<double>::infinity()).ok());
  EXPECT_TRUE(CheckFinite("reward", -1e30).ok());
}

TEST(ChecksTest, IntegersAreComparedInTheirOwnType) {
  EXPECT_TRUE(CheckInRange<uint32_t>("num_samples", 8, 1, 1024).ok());
  const absl::Status big = CheckInRange<uint32_t>("num_samples", 4294967295u, 1, 1024);
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("4294967295"), absl::string_view::npos) << big;
  EXPECT_FALSE(CheckInRange<uint32_t>("num_samples", 0, 1, 1024).ok());
  EXPECT_FALSE(CheckInRange<uint64_t>("rank", uint64_t{1} << 31, 0, 1023).ok());
}

}  // namespace
}  // namespace rlfleet::common

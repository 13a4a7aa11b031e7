// PushChains' chains: replicas that may relay spread over the fan-out's chains, one
// that may not ends a chain or is one of its own. (Rounds themselves: weights_core_test.)
#include "services/weights/push_chains.h"

#include "gtest/gtest.h"

namespace rlfleet::weights {
namespace {

using Chains = std::vector<std::vector<std::string>>;

TEST(PushChains, RelaysSpreadOverTheFanoutAndLeavesEndChains) {
  EXPECT_EQ(PushChains::ChainsOf({{"a", true}, {"b", true}, {"c", true}}, 1), (Chains{{"a", "b", "c"}}));
  EXPECT_EQ(PushChains::ChainsOf({{"a", true}, {"b", true}, {"c", true}}, 2), (Chains{{"a", "c"}, {"b"}}));
  EXPECT_EQ(PushChains::ChainsOf({{"a", true}, {"x", false}, {"b", true}}, 1), (Chains{{"a", "b", "x"}}));
  // More leaves than chains: the rest are chains of their own.
  EXPECT_EQ(PushChains::ChainsOf({{"a", true}, {"x", false}, {"y", false}}, 1), (Chains{{"a", "x"}, {"y"}}));
  // Fan-out 0: each replica its own.
  EXPECT_EQ(PushChains::ChainsOf({{"a", true}, {"b", true}}, 0), (Chains{{"a"}, {"b"}}));
  EXPECT_EQ(PushChains::ChainsOf({{"x", false}}, 2), (Chains{{"x"}}));
  EXPECT_TRUE(PushChains::ChainsOf({}, 2).empty());
}

}  // namespace
}  // namespace rlfleet::weights

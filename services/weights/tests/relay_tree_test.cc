// RelayTree on its own: the fan-out bounds what every sender sends, a failed or gone
// holder serves nobody, and a pull with no sender free waits for one under way.
#include "services/weights/relay_tree.h"

#include <map>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace rlfleet::weights {
namespace {

RelayTree::Sender Holder(const std::string& id) {
  RelayTree::Sender s;
  s.replica_id = id;
  s.source.set_length_bytes(100);
  return s;
}

std::string From(const std::optional<RelayTree::Sender>& s) { return s ? s->replica_id : "here"; }

TEST(RelayTree, ThisServiceFillsItsSlotsFirstThenEachHolderAtMostFanout) {
  RelayTree tree(2);
  const absl::Time soon = absl::Now() + absl::Seconds(5);
  EXPECT_EQ(From(tree.Begin(1, soon)), "here");
  EXPECT_EQ(From(tree.Begin(1, soon)), "here");
  tree.End(1, Holder("a"));
  tree.End(1, Holder("b"));
  std::map<std::string, int> sent;
  for (int i = 0; i < 4; ++i) {
    ++sent[From(tree.Begin(1, soon))];
    tree.End(1, std::nullopt);
  }
  EXPECT_EQ(sent["a"], 2);
  EXPECT_EQ(sent["b"], 2);
  // Nobody has room and nothing is under way: this service sends it again.
  EXPECT_EQ(From(tree.Begin(1, soon)), "here");
  tree.End(1, std::nullopt);
  // Another version has its own tree.
  EXPECT_EQ(From(tree.Begin(2, soon)), "here");
}

TEST(RelayTree, AFailedOrGoneHolderServesNobody) {
  RelayTree tree(1);
  const absl::Time soon = absl::Now() + absl::Seconds(5);
  EXPECT_EQ(From(tree.Begin(1, soon)), "here");
  tree.End(1, Holder("a"));
  tree.Failed(1, "a");
  EXPECT_EQ(From(tree.Begin(1, soon)), "here");
  tree.End(1, Holder("b"));
  tree.Gone("b");
  EXPECT_EQ(From(tree.Begin(1, soon)), "here");
  tree.End(1, std::nullopt);
}

TEST(RelayTree, APullWithNoSenderFreeWaitsForOneUnderWay) {
  RelayTree tree(1);
  const absl::Time soon = absl::Now() + absl::Seconds(20);
  EXPECT_EQ(From(tree.Begin(1, soon)), "here");  // under way: this service's one slot
  std::optional<RelayTree::Sender> second;
  absl::Notification done;
  std::thread waiter([&] {
    second = tree.Begin(1, soon);
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  tree.End(1, Holder("a"));  // the first pull ends: "a" holds it now
  waiter.join();
  EXPECT_EQ(From(second), "a");
  // With nothing under way the wait ends at once (its deadline far away).
  tree.End(1, std::nullopt);
  EXPECT_EQ(From(tree.Begin(1, soon)), "here");
}

TEST(RelayTree, AWaitEndsAtItsDeadlineWithThisService) {
  RelayTree tree(1);
  EXPECT_EQ(From(tree.Begin(1, absl::Now() + absl::Seconds(5))), "here");
  const absl::Time start = absl::Now();
  EXPECT_EQ(From(tree.Begin(1, start + absl::Milliseconds(200))), "here");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  tree.ForgetBefore(2);  // (pulls under way: kept)
  tree.End(1, Holder("a"));
  tree.End(1, std::nullopt);
  tree.ForgetBefore(2);
  EXPECT_EQ(From(tree.Begin(1, absl::Now() + absl::Seconds(5))), "here");  // (a new tree)
}

}  // namespace
}  // namespace rlfleet::weights

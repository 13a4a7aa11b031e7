// TaskRoutedReward: each task's items go to the replica that serves it (one call per
// replica), the rest to the reward service, the results in request order; a routed
// replica's error names its task. RewardTaskRoutes reads the registry labels.
#include "services/controller/reward_routes.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace rlfleet::controller {
namespace {

// Scores every item `reward`, counting calls and items.
class FixedReward : public RewardPeer {
 public:
  explicit FixedReward(float reward, absl::Status fails = absl::OkStatus()) : reward_(reward), fails_(fails) {}
  absl::Status Score(const v1::ScoreRequest& request, v1::ScoreResponse* response) override {
    ++calls;
    items += request.items_size();
    if (!fails_.ok()) return fails_;
    for (const v1::ScoreItem& item : request.items()) {
      v1::ScoreResult* r = response->add_results();
      r->set_item_id(item.item_id());
      r->set_reward(reward_);
    }
    return absl::OkStatus();
  }
  int calls = 0;
  int items = 0;

 private:
  const float reward_;
  const absl::Status fails_;
};

v1::ScoreRequest Items(const std::vector<std::string>& tasks) {
  v1::ScoreRequest request;
  for (size_t i = 0; i < tasks.size(); ++i) {
    v1::ScoreItem* item = request.add_items();
    item->set_item_id("e" + std::to_string(i));
    item->set_task(tasks[i]);
  }
  return request;
}

TEST(TaskRoutedReward, EachTaskGoesToItsReplicaAndResultsKeepRequestOrder) {
  auto fallback = std::make_unique<FixedReward>(0.0f);
  FixedReward* fallback_peer = fallback.get();
  auto python = std::make_shared<FixedReward>(0.5f);
  TaskRoutedReward routed(std::move(fallback), {{"mine", python}, {"also_mine", python}});
  v1::ScoreResponse response;
  ASSERT_TRUE(routed.Score(Items({"reverse", "mine", "also_mine", "reverse", "mine"}), &response).ok());
  ASSERT_EQ(response.results_size(), 5);
  const std::vector<float> want = {0.0f, 0.5f, 0.5f, 0.0f, 0.5f};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(response.results(i).item_id(), "e" + std::to_string(i));
    EXPECT_EQ(response.results(i).reward(), want[i]) << i;
  }
  EXPECT_EQ(python->calls, 1);  // (both of its tasks in one call)
  EXPECT_EQ(python->items, 3);
  EXPECT_EQ(fallback_peer->calls, 1);
  EXPECT_EQ(fallback_peer->items, 2);
}

TEST(TaskRoutedReward, AFailingReplicaFailsTheBatchNamingItsTask) {
  auto broken = std::make_shared<FixedReward>(0.0f, absl::UnavailableError("connection refused"));
  TaskRoutedReward routed(std::make_unique<FixedReward>(1.0f), {{"mine", broken}});
  v1::ScoreResponse response;
  absl::Status s = routed.Score(Items({"reverse", "mine"}), &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "task mine")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "connection refused")) << s;
}

TEST(RewardTaskRoutes, TheLabelNamesTheTasksAndTheFirstReplicaWins) {
  std::vector<v1::ReplicaInfo> replicas(3);
  replicas[0].set_role(v1::REPLICA_ROLE_REWARD);
  replicas[0].set_grpc_address("fleet-reward:1");  // (no label: the default reward service)
  replicas[1].set_role(v1::REPLICA_ROLE_REWARD);
  replicas[1].set_grpc_address("python-a:2");
  (*replicas[1].mutable_labels())[kRewardTasksLabel] = "mine, other";
  replicas[2].set_role(v1::REPLICA_ROLE_REWARD);
  replicas[2].set_grpc_address("python-b:3");
  (*replicas[2].mutable_labels())[kRewardTasksLabel] = "other,third";
  const std::map<std::string, std::string> routes = RewardTaskRoutes(replicas);
  EXPECT_EQ(routes, (std::map<std::string, std::string>{
                        {"mine", "python-a:2"}, {"other", "python-a:2"}, {"third", "python-b:3"}}));
  EXPECT_FALSE(ServesNamedTasksOnly(replicas[0]));
  EXPECT_TRUE(ServesNamedTasksOnly(replicas[1]));
}

// Records each call's size and scores item i with its response's length.
class SizedReward : public RewardPeer {
 public:
  absl::Status Score(const v1::ScoreRequest& request, v1::ScoreResponse* response) override {
    calls.push_back({request.items_size(), request.ByteSizeLong()});
    if (calls.size() == fail_at) return absl::UnavailableError("gone");
    for (const v1::ScoreItem& item : request.items()) {
      v1::ScoreResult* r = response->add_results();
      r->set_item_id(item.item_id());
      r->set_reward(static_cast<float>(item.response_text().size()));
    }
    response->set_elapsed_ms(1);
    return absl::OkStatus();
  }
  std::vector<std::pair<int, size_t>> calls;  // items, bytes
  size_t fail_at = 0;                         // (1-based call that fails; 0: none)
};

v1::ScoreRequest Texts(int count, size_t bytes) {
  v1::ScoreRequest request;
  for (int i = 0; i < count; ++i) {
    v1::ScoreItem* item = request.add_items();
    item->set_item_id("e" + std::to_string(i));
    item->set_task("reverse");
    item->set_response_text(std::string(bytes + i, 'x'));
  }
  return request;
}

TEST(SplitReward, ABatchIsScoredInCallsWithinTheByteAndItemBoundsInOrder) {
  constexpr size_t kMax = 100 << 10;
  for (const auto& [count, bytes] : std::vector<std::pair<int, size_t>>{{1024, 8 << 10}, {64, 60 << 10}, {3000, 10}}) {
    auto* inner = new SizedReward;
    SplitReward split(std::unique_ptr<RewardPeer>(inner), kMaxScoreItems, kMax);
    v1::ScoreResponse response;
    ASSERT_TRUE(split.Score(Texts(count, bytes), &response).ok());
    ASSERT_EQ(response.results_size(), count);
    for (int i = 0; i < count; ++i) {
      EXPECT_EQ(response.results(i).item_id(), "e" + std::to_string(i));
      EXPECT_EQ(response.results(i).reward(), static_cast<float>(bytes + i));
    }
    int items = 0;
    for (const auto& [n, size] : inner->calls) {
      EXPECT_LE(n, kMaxScoreItems);
      EXPECT_LE(size, kMax);
      items += n;
    }
    EXPECT_EQ(items, count);
    // As few calls as the bounds allow (each call but the last is full).
    const size_t total = Texts(count, bytes).ByteSizeLong();
    EXPECT_LE(inner->calls.size(),
              std::max<size_t>((count + kMaxScoreItems - 1) / kMaxScoreItems, 2 * (total + kMax - 1) / kMax));
    EXPECT_EQ(response.elapsed_ms(), static_cast<double>(inner->calls.size()));
  }
  // A batch within the bounds is one call, as it was.
  auto* inner = new SizedReward;
  SplitReward split(std::unique_ptr<RewardPeer>(inner), kMaxScoreItems, kMax);
  v1::ScoreResponse response;
  ASSERT_TRUE(split.Score(Texts(10, 100), &response).ok());
  EXPECT_EQ(inner->calls.size(), 1u);
}

TEST(SplitReward, AnItemOverTheBoundAndAFailingPartFailTheBatch) {
  auto* inner = new SizedReward;
  SplitReward split(std::unique_ptr<RewardPeer>(inner), kMaxScoreItems, 4096);
  v1::ScoreResponse response;
  v1::ScoreRequest request = Texts(3, 100);
  request.mutable_items(1)->set_response_text(std::string(5000, 'y'));
  absl::Status s = split.Score(request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "items[1] (e1)")) << s;
  EXPECT_TRUE(inner->calls.empty());
  inner->fail_at = 2;
  s = split.Score(Texts(100, 1000), &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "part 2 of ")) << s;
}

}  // namespace
}  // namespace rlfleet::controller

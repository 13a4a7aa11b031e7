// Data parallelism over Gloo on loopback: two ranks, each training on its part of a
// batch, end a step where one rank training on the whole batch does.
#include "libs/dist/gloo_group.h"

#include <cmath>
#include <thread>

#include "gtest/gtest.h"
#include "libs/model/test_util.h"

namespace rlfleet::dist {
namespace {

using model::MaxAbsDiff;

model::PolicyConfig Small() { return model::TinyConfig(); }

std::vector<model::TrainSequence> Batch() { return model::VariedBatch(6); }

TEST(GlooGroup, TwoRanksOnHalvesEqualOneRankOnTheWholeBatch) {
  const std::vector<model::TrainSequence> batch = Batch();
  model::TrainOptions options;
  options.epochs = 2;
  options.weight_decay = 0.01f;
  const std::vector<std::vector<int32_t>> probe = {{1, 4, 5, 6, 7, 8}};

  auto single = model::Policy::Create(Small(), model::TestDevice(), 7);
  ASSERT_TRUE(single.ok());
  for (int step = 0; step < 3; ++step) ASSERT_TRUE((*single)->TrainStep(batch, options).ok());
  const std::vector<float> want = *(*single)->Logits(probe);

  auto rendezvous = Rendezvous::Serve("127.0.0.1", 0, 2, absl::Seconds(30));
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status();
  std::vector<float> got[2];
  absl::Status status[2];
  // Same init on every rank (created here: the init RNG is process-global).
  std::unique_ptr<model::Policy> policies[2];
  for (auto& p : policies) p = std::move(*model::Policy::Create(Small(), model::TestDevice(), 7));
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      GlooGroupOptions o;
      o.rank = r;
      o.world_size = 2;
      o.store_port = (*rendezvous)->port();
      o.timeout = absl::Seconds(30);
      auto group = GlooGroup::Join(o, r == 0 ? rendezvous->get() : nullptr);
      if (!group.ok()) {
        status[r] = group.status();
        return;
      }
      model::Policy* policy = policies[r].get();
      std::vector<model::TrainSequence> mine;
      for (size_t i = r; i < batch.size(); i += 2) mine.push_back(batch[i]);  // 1+1+3 vs 2+4+2 tokens
      model::TrainOptions o2 = options;
      o2.group = group->get();
      for (int step = 0; step < 3 && status[r].ok(); ++step) status[r] = policy->TrainStep(mine, o2).status();
      if (status[r].ok()) got[r] = *policy->Logits(probe);
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  EXPECT_LT(MaxAbsDiff(got[0], got[1]), 1e-6f) << "the ranks drifted apart";
  EXPECT_LT(MaxAbsDiff(got[0], want), 1e-4f) << "DP differs from one rank on the whole batch";
  // The check can fail: a rank training on its half alone lands elsewhere.
  auto alone = model::Policy::Create(Small(), model::TestDevice(), 7);
  std::vector<model::TrainSequence> half;
  for (size_t i = 0; i < batch.size(); i += 2) half.push_back(batch[i]);
  for (int step = 0; step < 3; ++step) ASSERT_TRUE((*alone)->TrainStep(half, options).ok());
  EXPECT_GT(MaxAbsDiff(*(*alone)->Logits(probe), want), 1e-3f);
}

TEST(GlooGroup, BroadcastAndADeadPeerIsAnErrorWithinTheTimeout) {
  auto rendezvous = Rendezvous::Serve("127.0.0.1", 0, 2, absl::Seconds(10));
  ASSERT_TRUE(rendezvous.ok());
  std::unique_ptr<GlooGroup> groups[2];
  std::thread other([&] {
    GlooGroupOptions o;
    o.rank = 1;
    o.world_size = 2;
    o.store_port = (*rendezvous)->port();
    o.timeout = absl::Seconds(3);
    auto g = GlooGroup::Join(o);
    ASSERT_TRUE(g.ok()) << g.status();
    groups[1] = std::move(*g);
  });
  GlooGroupOptions o;
  o.world_size = 2;
  o.timeout = absl::Seconds(3);
  auto g0 = GlooGroup::Join(o, rendezvous->get());
  other.join();
  ASSERT_TRUE(g0.ok()) << g0.status();
  groups[0] = std::move(*g0);
  ASSERT_NE(groups[1], nullptr);
  std::string sent = "batch for step 7", received;
  absl::Status rs;
  std::thread receiver([&] { rs = groups[1]->Broadcast(&received); });
  ASSERT_TRUE(groups[0]->Broadcast(&sent).ok());
  receiver.join();
  ASSERT_TRUE(rs.ok()) << rs;
  EXPECT_EQ(received, sent);
  // Rank 1 never joins this all-reduce: rank 0 gets an error within its timeout.
  float x[4] = {1, 2, 3, 4};
  const absl::Time start = absl::Now();
  absl::Status s = groups[0]->AllReduceSum(x, 4);
  EXPECT_FALSE(s.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << s;
  EXPECT_EQ(GlooGroup::Join(GlooGroupOptions{3, 2}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rlfleet::dist

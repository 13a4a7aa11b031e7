// TransportGroup: data-parallel training whose gradients go through the topology-aware
// all-reduce over UCX (TCP on loopback): 4 ranks on 2 "nodes" (hierarchical) and 4
// ranks in a flat ring give the parameters one rank gets on the whole batch.
#include "libs/dist/transport_group.h"

#include <thread>

#include "gtest/gtest.h"
#include "libs/model/test_util.h"

namespace rlfleet::dist {
namespace {

using model::MaxAbsDiff;

std::vector<model::TrainSequence> Batch() { return model::VariedBatch(8); }

void FourRanksEqualOneRank(bool hierarchical) {
  constexpr int kRanks = 4;
  const std::vector<model::TrainSequence> batch = Batch();
  model::TrainOptions options;
  options.epochs = 2;
  const std::vector<std::vector<int32_t>> probe = {{1, 4, 5, 6, 7, 8}};
  auto single = model::Policy::Create(model::TinyConfig(), model::TestDevice(), 7);
  ASSERT_TRUE(single.ok());
  for (int step = 0; step < 3; ++step) ASSERT_TRUE((*single)->TrainStep(batch, options).ok());
  const std::vector<float> want = *(*single)->Logits(probe);

  auto rendezvous = Rendezvous::Serve("127.0.0.1", 0, kRanks, absl::Seconds(30));
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status();
  std::unique_ptr<model::Policy> policies[kRanks];
  for (auto& p : policies) p = std::move(*model::Policy::Create(model::TinyConfig(), model::TestDevice(), 7));
  std::vector<float> got[kRanks];
  absl::Status status[kRanks];
  bool used_hierarchical[kRanks] = {};
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      GlooGroupOptions o;
      o.rank = r;
      o.world_size = kRanks;
      o.store_port = (*rendezvous)->port();
      o.timeout = absl::Seconds(30);
      auto bootstrap = GlooGroup::Join(o, r == 0 ? rendezvous->get() : nullptr);
      if (!bootstrap.ok()) {
        status[r] = bootstrap.status();
        return;
      }
      TransportGroupOptions t;
      t.node = r < 2 ? "node-a" : "node-b";
      t.hierarchical = hierarchical;
      t.ucx_tls = "tcp";
      t.timeout = absl::Seconds(30);
      auto group = TransportGroup::Create(std::move(*bootstrap), t);
      if (!group.ok()) {
        status[r] = group.status();
        return;
      }
      used_hierarchical[r] = (*group)->hierarchical();
      std::vector<model::TrainSequence> mine;
      for (size_t i = r; i < batch.size(); i += kRanks) mine.push_back(batch[i]);
      model::TrainOptions o2 = options;
      o2.group = group->get();
      for (int step = 0; step < 3 && status[r].ok(); ++step) status[r] = policies[r]->TrainStep(mine, o2).status();
      if (status[r].ok()) got[r] = *policies[r]->Logits(probe);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    EXPECT_EQ(used_hierarchical[r], hierarchical) << r;
    EXPECT_LT(MaxAbsDiff(got[r], got[0]), 1e-6f) << "rank " << r << " drifted apart";
  }
  EXPECT_LT(MaxAbsDiff(got[0], want), 1e-4f) << "DP differs from one rank on the whole batch";
}

TEST(TransportGroup, HierarchicalOverTwoNodesEqualsOneRank) { FourRanksEqualOneRank(true); }
TEST(TransportGroup, FlatRingEqualsOneRank) { FourRanksEqualOneRank(false); }

}  // namespace
}  // namespace rlfleet::dist

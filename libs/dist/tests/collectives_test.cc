// Topology-aware groups on synthetic topologies, and flat / hierarchical all-reduce over
// loopback ranks: exact sums, every rank with the same bits, bounded error with a 16-bit
// wire, a silent rank an error within the deadline.
#include <cmath>
#include <random>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/dist/loopback_cluster.h"
#include "libs/dist/ring_collectives.h"
#include "libs/dist/topology.h"

namespace rlfleet::dist {
namespace {

TEST(Topology, NodesBySwitchRanksByNumaLeadersAndRails) {
  // Two switches; node "b" (switch s1) has 3 ranks, "a" and "c" (switch s2) 2 each;
  // rank 5 sits on NUMA 0 of node a, rank 1 on NUMA 1.
  std::vector<RankPlace> places = {{0, "b", 0, "s1"}, {1, "a", 1, "s2"}, {2, "b", 1, "s1"}, {3, "c", 0, "s2"},
                                   {4, "b", 0, "s1"}, {5, "a", 0, "s2"}, {6, "c", 1, "s2"}};
  auto t = BuildTopology(places);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nodes, (std::vector<std::string>{"b", "a", "c"}));  // s1 first, then s2 by name
  EXPECT_EQ(t->node_ranks, (std::vector<std::vector<int>>{{0, 4, 2}, {5, 1}, {3, 6}}));
  EXPECT_EQ(t->leaders, (std::vector<int>{0, 5, 3}));
  EXPECT_EQ(t->rails, (std::vector<std::vector<int>>{{0, 5, 3}, {4, 1, 6}, {2}}));
  EXPECT_EQ(t->node_of, (std::vector<int>{0, 1, 0, 2, 0, 1, 2}));
  // One node: one group, one leader.
  auto single = BuildTopology({{0, "h", 0, ""}, {1, "h", 0, ""}});
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->leaders, (std::vector<int>{0}));
  EXPECT_EQ(single->rails.size(), 2u);
}

TEST(Topology, RanksMustBeZeroToNMinusOneOnceEachWithANode) {
  EXPECT_EQ(BuildTopology({}).status().code(), absl::StatusCode::kInvalidArgument);
  auto twice = BuildTopology({{0, "a", 0, ""}, {0, "b", 0, ""}});
  EXPECT_TRUE(absl::StrContains(twice.status().message(), "rank 0 appears twice")) << twice.status();
  auto gap = BuildTopology({{0, "a", 0, ""}, {2, "b", 0, ""}});
  EXPECT_TRUE(absl::StrContains(gap.status().message(), "rank 2 is outside 0..1")) << gap.status();
  auto nameless = BuildTopology({{0, "", 0, ""}});
  EXPECT_TRUE(absl::StrContains(nameless.status().message(), "rank 0 has no node")) << nameless.status();
}

TEST(WireFormats, RoundTripAndRounding) {
  EXPECT_EQ(ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FromBf16(0x3f80), 1.0f);
  EXPECT_EQ(ToFp16(1.0f), 0x3c00);
  EXPECT_EQ(ToFp16(-2.0f), 0xc000);
  EXPECT_EQ(ToFp16(65504.0f), 0x7bff);                 // the largest half
  EXPECT_EQ(ToFp16(1e6f), 0x7c00);                     // overflow -> inf
  EXPECT_EQ(FromFp16(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(ToFp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(ToFp16(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 ulp rounds to even (2)
  EXPECT_EQ(ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(ToFp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie to even, upward
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-100, 100);
  for (int i = 0; i < 10000; ++i) {
    const float x = dist(gen);
    EXPECT_LE(std::abs(FromFp16(ToFp16(x)) - x), std::abs(x) * std::ldexp(1.0f, -11) + 1e-7f) << x;
    EXPECT_LE(std::abs(FromBf16(ToBf16(x)) - x), std::abs(x) * std::ldexp(1.0f, -8)) << x;
  }
}

// Each rank's data: values drawn from `seed + rank`; the exact sums in double, and the
// sums of magnitudes (which bound every partial sum).
std::vector<std::vector<float>> Inputs(int ranks, size_t n, std::vector<double>* exact,
                                       std::vector<double>* magnitude = nullptr) {
  std::vector<std::vector<float>> data(ranks, std::vector<float>(n));
  exact->assign(n, 0.0);
  if (magnitude != nullptr) magnitude->assign(n, 0.0);
  for (int r = 0; r < ranks; ++r) {
    std::mt19937 gen(100 + r);
    std::normal_distribution<float> dist(0, 1);
    for (size_t i = 0; i < n; ++i) {
      data[r][i] = dist(gen);
      (*exact)[i] += data[r][i];
      if (magnitude != nullptr) (*magnitude)[i] += std::abs(data[r][i]);
    }
  }
  return data;
}

struct Case {
  bool hierarchical;
  WirePrecision precision;
};

// With a 16-bit wire every partial sum is rounded once per hop it travels (unit
// roundoff u: 2^-8 for bf16, 2^-11 for fp16) and once more when it is final, so the
// error of an element is at most (hops + 1) * u * (sum of the inputs' magnitudes).
TEST(Collectives, FlatAndHierarchicalSumExactlyAndAgreeOnEveryRank) {
  LoopbackCluster cluster(/*nodes=*/3, /*ranks_per_node=*/3);
  const size_t n = 1000;  // not a multiple of the ring sizes
  for (const Case& c :
       {Case{false, WirePrecision::kFp32}, Case{true, WirePrecision::kFp32}, Case{false, WirePrecision::kBf16},
        Case{true, WirePrecision::kBf16}, Case{false, WirePrecision::kFp16}, Case{true, WirePrecision::kFp16}}) {
    std::vector<double> exact, magnitude;
    auto data = Inputs(cluster.size(), n, &exact, &magnitude);
    CollectiveOptions options;
    options.precision = c.precision;
    std::vector<int> everyone;
    for (int r = 0; r < cluster.size(); ++r) everyone.push_back(r);
    absl::Status s = cluster.RunOnAll([&](int rank) {
      return c.hierarchical
                 ? HierarchicalAllReduce(absl::MakeSpan(data[rank]), cluster.topology(), cluster.links(rank), options)
                 : RingAllReduce(absl::MakeSpan(data[rank]), everyone, cluster.links(rank), options);
    });
    const std::string what = absl::StrCat(c.hierarchical ? "hierarchical " : "flat ", WirePrecisionName(c.precision));
    ASSERT_TRUE(s.ok()) << what << ": " << s;
    const int ring = c.hierarchical ? 3 : 9;  // ranks of the ring the 16-bit wire is used on
    const double u = c.precision == WirePrecision::kBf16   ? std::ldexp(1.0, -8)
                     : c.precision == WirePrecision::kFp16 ? std::ldexp(1.0, -11)
                                                           : 0.0;
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      const double err = std::abs(data[0][i] - exact[i]);
      const double bound = ring * u * magnitude[i] + 1e-5 * magnitude[i];  // + fp32 rounding of the adds
      worst = std::max(worst, err);
      EXPECT_LE(err, bound) << what << ": element " << i;
    }
    if (c.precision == WirePrecision::kFp32) {
      EXPECT_LT(worst, 1e-4) << what;
    }
    for (int r = 1; r < cluster.size(); ++r) EXPECT_EQ(data[r], data[0]) << what << ": rank " << r << " differs";
  }
}

TEST(Collectives, HierarchicalNeedsEqualNodes) {
  LoopbackCluster cluster(2, 2);
  auto uneven = BuildTopology({{0, "a", 0, ""}, {1, "a", 0, ""}, {2, "a", 0, ""}, {3, "b", 0, ""}});
  ASSERT_TRUE(uneven.ok());
  std::vector<float> data(8, 1.0f);
  absl::Status s = HierarchicalAllReduce(absl::MakeSpan(data), *uneven, cluster.links(0), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "same number of ranks on every node")) << s;
}

TEST(Collectives, ARankThatNeverComesIsAnErrorWithinTheDeadline) {
  LoopbackCluster cluster(2, 2);
  std::vector<double> exact;
  auto data = Inputs(4, 64, &exact);
  CollectiveOptions options;
  options.timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::Status s = cluster.RunOnAll([&](int rank) -> absl::Status {
    if (rank == 3) return absl::OkStatus();  // never joins
    return RingAllReduce(absl::MakeSpan(data[rank]), {0, 1, 2, 3}, cluster.links(rank), options);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank")) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // A failed call's buffers are never kept for another (a late peer may write into them).
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(cluster.links(rank).buffers->kept_elements(), 0u) << rank;
}

// Calls of different sizes on one group reuse its buffers while they fit and stay exact:
// a smaller call after a larger one sums only its own elements; one of fewer elements
// than ranks (empty chunks) works too.
TEST(Collectives, BuffersAreKeptBetweenCallsAndReusedWhileTheyFit) {
  LoopbackCluster cluster(2, 2);
  std::vector<int> everyone = {0, 1, 2, 3};
  for (size_t n : {1000, 10, 5000, 1000, 1}) {
    std::vector<double> exact;
    auto data = Inputs(cluster.size(), n, &exact);
    absl::Status s = cluster.RunOnAll([&](int rank) {
      return RingAllReduce(absl::MakeSpan(data[rank]), everyone, cluster.links(rank), CollectiveOptions());
    });
    ASSERT_TRUE(s.ok()) << n << ": " << s;
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(data[0][i], exact[i], 1e-4) << n << ": element " << i;
    for (int r = 1; r < cluster.size(); ++r) EXPECT_EQ(data[r], data[0]) << n << ": rank " << r;
  }
  // The largest set (5000 elements) is what each rank keeps.
  for (int rank = 0; rank < cluster.size(); ++rank) EXPECT_EQ(cluster.links(rank).buffers->kept_elements(), 5000u);
}

}  // namespace
}  // namespace rlfleet::dist

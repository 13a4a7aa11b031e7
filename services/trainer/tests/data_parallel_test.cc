// JoinDataParallel: options out of range are refused naming the flag; one rank needs
// no group; two ranks on loopback join one (rank 0 serving the rendezvous on a port it
// picks and says) whose all-reduce sums across them.
#include "services/trainer/data_parallel.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace rlfleet::trainer {
namespace {

void Ignore(const std::string&) {}

DataParallelOptions Options(int world, int rank = 0, int port = 0, std::string allreduce = "gloo",
                            std::string wire = "fp32") {
  DataParallelOptions o;
  o.world = world;
  o.rank = rank;
  o.port = port;
  o.allreduce = std::move(allreduce);
  o.wire = std::move(wire);
  o.timeout = absl::Seconds(60);
  return o;
}

TEST(DataParallel, OptionsOutOfRangeAreRefusedNamingTheFlag) {
  const std::pair<DataParallelOptions, std::string> bad[] = {
      {Options(2, 0, 0, "nccl"), "--dp_allreduce=nccl"},
      {Options(2, 0, 0, "ring", "int8"), "--dp_wire=int8"},
      {Options(2, 2), "--dp_rank=2"},
      {Options(0), "--dp_world=0"},
      {Options(2, 0, 70000), "--dp_port=70000"},
  };
  for (const auto& [options, flag] : bad) {
    absl::StatusOr<DataParallel> dp = JoinDataParallel(options, Ignore);
    EXPECT_EQ(dp.status().code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_TRUE(absl::StrContains(dp.status().message(), flag)) << dp.status();
  }
  absl::StatusOr<DataParallel> one = JoinDataParallel({}, Ignore);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->group, nullptr);
  EXPECT_EQ(one->rendezvous, nullptr);
}

TEST(DataParallel, TwoRanksOnLoopbackJoinOneGroupThatSums) {
  absl::Mutex mu;
  int port = 0;
  std::vector<std::string> lines;
  const DataParallelOptions zero = Options(2);
  absl::StatusOr<DataParallel> rank0 = absl::UnknownError("not run");
  std::thread first([&] {
    rank0 = JoinDataParallel(zero, [&](const std::string& line) {
      absl::MutexLock lock(&mu);
      lines.push_back(line);
      // "dp rendezvous on 127.0.0.1:PORT (waiting for 1 more ranks)"
      if (auto at = line.find("127.0.0.1:"); at != std::string::npos) port = std::stoi(line.substr(at + 10));
    });
  });
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                        +[](int* p) { return *p != 0; }, &port),
                                    absl::Seconds(60)));
  }
  DataParallelOptions one = zero;
  one.rank = 1;
  one.port = port;
  absl::StatusOr<DataParallel> rank1 = JoinDataParallel(one, Ignore);
  first.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  ASSERT_NE(rank0->group, nullptr);
  ASSERT_NE(rank1->group, nullptr);
  EXPECT_NE(rank0->rendezvous, nullptr);
  EXPECT_EQ(rank1->rendezvous, nullptr);
  EXPECT_TRUE(absl::StrContains(lines.back(), "rank 0 of 2 joined")) << lines.back();
  // Their all-reduce sums across the two ranks.
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
  absl::Status s0, s1;
  std::thread reduce([&] { s0 = rank0->group->AllReduceSum(a.data(), a.size()); });
  s1 = rank1->group->AllReduceSum(b.data(), b.size());
  reduce.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(a, (std::vector<float>{11, 22, 33}));
  EXPECT_EQ(b, a);
}

}  // namespace
}  // namespace rlfleet::trainer

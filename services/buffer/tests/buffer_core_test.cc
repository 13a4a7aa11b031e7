#include "services/buffer/buffer_core.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/sync_stream.h>

#include <atomic>
#include <cstdlib>
#include <numeric>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/common/ids.h"
#include "libs/rpc/server_runner.h"
#include "services/buffer/buffer_service.h"
#include "services/buffer/tests/test_experience.h"
#include "tests/util/redis_for_test.h"

namespace rlfleet::buffer {
namespace {

class BufferCoreTest : public ::testing::Test {
 protected:
  void Configure(uint32_t group_size, std::optional<uint32_t> max_staleness = {}, uint64_t capacity = 64 << 20,
                 bool filter = true) {
    v1::ConfigureRequest c;
    c.set_group_size(group_size);
    if (max_staleness) c.set_max_staleness(*max_staleness);
    c.set_capacity_bytes(capacity);
    c.set_filter_zero_variance(filter);
    v1::ConfigureResponse r;
    ASSERT_TRUE(core_.Configure(c, &r).ok());
  }
  v1::PutExperiencesResponse Put(std::vector<v1::Experience> exps, absl::Status* status = nullptr) {
    v1::PutExperiencesRequest req;
    for (auto& e : exps) *req.add_experiences() = e;
    v1::PutExperiencesResponse resp;
    absl::Status s = core_.Put(req, &resp);
    if (status)
      *status = s;
    else
      EXPECT_TRUE(s.ok()) << s;
    return resp;
  }
  v1::SampleBatchResponse Sample(uint32_t n, uint64_t current = 0, int64_t wait_ms = 0, uint32_t min = 0,
                                 const std::string& consumer = "") {
    v1::SampleBatchRequest req;
    req.set_num_groups(n);
    req.set_min_groups(min);
    req.set_current_policy_version(current);
    req.set_wait_ms(wait_ms);
    req.set_consumer_id(consumer);
    v1::SampleBatchResponse resp;
    absl::Status s = core_.SampleBatch(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    return resp;
  }
  absl::Status Ack(const std::string& lease_id) {
    v1::AckBatchRequest ack;
    ack.set_lease_id(lease_id);
    v1::AckBatchResponse acked;
    return core_.Ack(ack, &acked);
  }
  v1::GetStatsResponse Stats() {
    v1::GetStatsResponse s;
    EXPECT_TRUE(core_.GetStats(&s).ok());
    return s;
  }
  common::FakeClock clock_;
  BufferCore core_{&clock_};
};

TEST_F(BufferCoreTest, AssemblesGroupsAndSamplesOnlyCompleteOnes) {
  Configure(2);
  auto r = Put({Exp("a1", "A", 1), Exp("b1", "B", 1), Exp("a2", "A", 0)});
  EXPECT_EQ(r.accepted(), 3u);
  EXPECT_EQ(Stats().complete_groups(), 1u);
  EXPECT_EQ(Stats().partial_groups(), 1u);
  auto s = Sample(4);
  ASSERT_EQ(s.groups_size(), 1);
  EXPECT_EQ(s.groups(0).group_id(), "A");
  EXPECT_EQ(s.groups(0).experiences_size(), 2);
  EXPECT_FLOAT_EQ(s.groups(0).reward_mean(), 0.5f);
  EXPECT_FLOAT_EQ(s.groups(0).reward_std(), 0.5f);
  EXPECT_FALSE(s.lease_id().empty());
}

TEST_F(BufferCoreTest, ExactlyOnceByExperienceId) {
  Configure(1);
  EXPECT_EQ(Put({Exp("x", "", 1), Exp("x", "", 1)}).duplicates(), 1u);  // within a batch
  auto again = Put({Exp("x", "", 1), Exp("y", "", 1)});
  EXPECT_EQ(again.accepted(), 1u);
  EXPECT_EQ(again.duplicates(), 1u);
  EXPECT_EQ(again.duplicate_ids(0).value(), "x");
  // Still a duplicate after it was consumed.
  auto s = Sample(10);
  v1::AckBatchRequest ack;
  ack.set_lease_id(s.lease_id());
  v1::AckBatchResponse acked;
  ASSERT_TRUE(core_.Ack(ack, &acked).ok());
  EXPECT_EQ(Put({Exp("x", "", 1)}).duplicates(), 1u);
  EXPECT_EQ(Stats().dropped().duplicate(), 3u);
}

TEST_F(BufferCoreTest, RejectionsNameTheFieldAndAreCounted) {
  Configure(2);
  v1::Experience no_reward = Exp("n", "G", 1);
  no_reward.clear_reward();
  v1::Experience bad_logprobs = Exp("l", "G", 1);
  bad_logprobs.add_response_logprobs(0);
  auto r = Put({no_reward, bad_logprobs, Exp("g1", "G", 1), Exp("g2", "G", 0), Exp("g3", "G", 1)});
  EXPECT_EQ(r.accepted(), 2u);
  ASSERT_EQ(r.rejected(), 3u);
  EXPECT_EQ(r.rejections(0).reason(), v1::REJECT_REASON_NO_REWARD);
  EXPECT_EQ(r.rejections(1).reason(), v1::REJECT_REASON_INVALID);
  EXPECT_TRUE(absl::StrContains(r.rejections(1).message(), "response_logprobs: 5 entries, want 4"));
  EXPECT_EQ(r.rejections(2).reason(), v1::REJECT_REASON_GROUP_FULL);
  EXPECT_EQ(r.rejections(2).index(), 4u);
  EXPECT_EQ(Stats().dropped().rejected(), 3u);
}

TEST_F(BufferCoreTest, StalenessIsEnforcedOnPutAndOnSample) {
  Configure(1, /*max_staleness=*/1);
  Put({Exp("v3", "", 1, /*version=*/3)});  // the buffer now knows version 3
  auto r = Put({Exp("v1", "", 1, /*version=*/1), Exp("v2", "", 1, /*version=*/2)});
  EXPECT_EQ(r.accepted(), 1u);
  ASSERT_EQ(r.rejected(), 1u);
  EXPECT_EQ(r.rejections(0).reason(), v1::REJECT_REASON_STALE);
  // The trainer has moved to version 4: v2 is now 2 behind and is dropped.
  auto s = Sample(10, /*current=*/4);
  EXPECT_EQ(s.dropped_stale_groups(), 1u);
  ASSERT_EQ(s.groups_size(), 1);
  EXPECT_EQ(s.groups(0).experiences(0).experience_id().value(), "v3");
  EXPECT_EQ(Stats().dropped().stale(), 1u);
}

TEST_F(BufferCoreTest, ZeroVarianceGroupsAreDroppedUnlessDisabled) {
  Configure(2);
  Put({Exp("a1", "A", 1), Exp("a2", "A", 1), Exp("b1", "B", 1), Exp("b2", "B", 0)});
  auto s = Sample(10);
  EXPECT_EQ(s.dropped_zero_variance_groups(), 1u);
  ASSERT_EQ(s.groups_size(), 1);
  EXPECT_EQ(s.groups(0).group_id(), "B");
  EXPECT_EQ(Stats().dropped().zero_variance(), 2u);

  Configure(2, {}, 64 << 20, /*filter=*/false);  // same group size: allowed while holding
  Put({Exp("c1", "C", 1), Exp("c2", "C", 1)});
  EXPECT_EQ(Sample(10).groups_size(), 1);
}

TEST_F(BufferCoreTest, CapacityBackpressureTakesNothingAndRecoversAfterAck) {
  Configure(1, {}, /*capacity=*/1 << 20);
  // ~40 KiB each (under capacity/16 = 64 KiB).
  std::vector<v1::Experience> batch;
  for (int i = 0; i < 20; ++i) batch.push_back(Exp(absl::StrCat("e", i), "", 1, 1, 5000));
  auto first = Put(batch);
  EXPECT_EQ(first.accepted(), 20u);
  std::vector<v1::Experience> more;
  for (int i = 20; i < 40; ++i) more.push_back(Exp(absl::StrCat("e", i), "", 1, 1, 5000));
  absl::Status full;
  Put(more, &full);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_TRUE(absl::StrContains(full.message(), "nothing was taken"));
  EXPECT_EQ(Stats().accepted_total(), 20u);
  // The trainer consumes; the same batch then fits, and none of it counts as a duplicate.
  auto s = Sample(20);
  v1::AckBatchRequest ack;
  ack.set_lease_id(s.lease_id());
  v1::AckBatchResponse acked;
  ASSERT_TRUE(core_.Ack(ack, &acked).ok());
  EXPECT_EQ(acked.consumed_experiences(), 20u);
  EXPECT_EQ(Put(more).accepted(), 20u);
  // One experience too large for the buffer at all is rejected, not backpressured.
  auto huge = Put({Exp("huge", "", 1, 1, 20000)});
  ASSERT_EQ(huge.rejected(), 1u);
  EXPECT_EQ(huge.rejections(0).reason(), v1::REJECT_REASON_TOO_LARGE);
}

TEST_F(BufferCoreTest, LeasesAckNackAndExpire) {
  Configure(1);
  Put({Exp("a", "", 1), Exp("b", "", 0)});
  auto s = Sample(1);
  ASSERT_EQ(s.groups_size(), 1);
  v1::NackBatchRequest nack;
  nack.set_lease_id(s.lease_id());
  v1::NackBatchResponse nacked;
  ASSERT_TRUE(core_.Nack(nack, &nacked).ok());
  EXPECT_EQ(nacked.returned_experiences(), 1u);
  // Nacked groups come back first.
  auto again = Sample(1);
  EXPECT_EQ(again.groups(0).experiences(0).experience_id().value(), "a");
  // Let the lease expire: its group returns to the buffer, and a late ack is NOT_FOUND.
  clock_.Advance(absl::Seconds(61));
  EXPECT_EQ(Stats().open_leases(), 0u);
  EXPECT_EQ(Stats().complete_groups(), 2u);
  v1::AckBatchRequest late;
  late.set_lease_id(again.lease_id());
  v1::AckBatchResponse late_response;
  EXPECT_EQ(core_.Ack(late, &late_response).code(), absl::StatusCode::kNotFound);
  // Acking twice is safe.
  auto last = Sample(2);
  v1::AckBatchRequest ack;
  ack.set_lease_id(last.lease_id());
  v1::AckBatchResponse a1, a2;
  ASSERT_TRUE(core_.Ack(ack, &a1).ok());
  ASSERT_TRUE(core_.Ack(ack, &a2).ok());
  EXPECT_EQ(a1.consumed_experiences(), 2u);
  EXPECT_TRUE(a2.already_acked());
  EXPECT_EQ(Stats().buffer_bytes(), 0u);
}

// A restarted trainer (a new incarnation under the same consumer name) gets the groups
// its predecessor leased at its first sample, not after their lease ran out; another
// consumer's leases, and leases without an incarnation, are left alone.
TEST_F(BufferCoreTest, ANewIncarnationOfAConsumerTakesOverItsPredecessorsLeases) {
  Configure(1);
  Put({Exp("a", "", 1), Exp("b", "", 0), Exp("c", "", 1)});
  auto sample_as = [&](const std::string& consumer, uint32_t n) { return Sample(n, 0, 0, 0, consumer); };
  auto old = sample_as("trainer@h:1#p1", 1);  // "a", then the trainer dies
  ASSERT_EQ(old.groups_size(), 1);
  auto other = sample_as("trainer@h:2#p7", 1);  // another trainer's lease: "b"
  auto plain = sample_as("controller", 1);      // no incarnation: "c"
  ASSERT_EQ(other.groups_size(), 1);
  ASSERT_EQ(plain.groups_size(), 1);
  EXPECT_EQ(Stats().open_leases(), 3u);
  auto restarted = sample_as("trainer@h:1#p2", 3);
  ASSERT_EQ(restarted.groups_size(), 1);
  EXPECT_EQ(restarted.groups(0).experiences(0).experience_id().value(), "a");
  EXPECT_EQ(Stats().open_leases(), 3u);  // (the old one ended, the new one opened)
  EXPECT_EQ(Ack(old.lease_id()).code(), absl::StatusCode::kNotFound);
}

// Consumed ids stay duplicates for a window of the newest N, not for ever (every id
// ever taken used to stay in memory: the buffer grew without bound on a long run).
TEST_F(BufferCoreTest, ConsumedIdsStayDuplicatesForABoundedWindow) {
  Configure(1);
  core_.SetRememberedRemovedIds(3);
  for (const char* id : {"a", "b", "c", "d", "e"}) {
    Put({Exp(id, "", 1)});
    auto s = Sample(1);
    ASSERT_EQ(s.groups_size(), 1);
    ASSERT_TRUE(Ack(s.lease_id()).ok());
  }
  // c, d, e are remembered: duplicates. a and b have left the window: taken again.
  EXPECT_EQ(Put({Exp("e", "", 1)}).duplicates(), 1u);
  EXPECT_EQ(Put({Exp("c", "", 1)}).duplicates(), 1u);
  EXPECT_EQ(Put({Exp("a", "", 1)}).accepted(), 1u);
  // Held ids are duplicates however many have gone since.
  EXPECT_EQ(Put({Exp("a", "", 1)}).duplicates(), 1u);
}

TEST_F(BufferCoreTest, SampleWaitsForGroupsUpToItsDeadline) {
  Configure(1);
  const absl::Time start = absl::Now();
  auto empty = Sample(1, 0, /*wait_ms=*/100, /*min=*/1);
  EXPECT_EQ(empty.groups_size(), 0);
  EXPECT_TRUE(empty.lease_id().empty());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  std::thread producer([&] {
    absl::SleepFor(absl::Milliseconds(50));  // a producer that arrives a little later
    Put({Exp("late", "", 1)});
  });
  auto got = Sample(1, 0, /*wait_ms=*/10000, /*min=*/1);
  producer.join();
  EXPECT_EQ(got.groups_size(), 1);
}

TEST_F(BufferCoreTest, BadRequestsAreInvalidArgument) {
  v1::ConfigureRequest c;
  c.set_group_size(0);
  v1::ConfigureResponse cr;
  EXPECT_EQ(core_.Configure(c, &cr).code(), absl::StatusCode::kInvalidArgument);
  c.set_group_size(2);
  c.set_capacity_bytes(1000);
  EXPECT_TRUE(absl::StrContains(core_.Configure(c, &cr).message(), "capacity_bytes"));
  v1::SampleBatchRequest s;
  v1::SampleBatchResponse sr;
  EXPECT_EQ(core_.SampleBatch(s, &sr).code(), absl::StatusCode::kInvalidArgument);
  s.set_num_groups(1);
  s.set_min_groups(2);
  EXPECT_EQ(core_.SampleBatch(s, &sr).code(), absl::StatusCode::kInvalidArgument);
  v1::PutExperiencesRequest p;
  v1::PutExperiencesResponse pr;
  EXPECT_EQ(core_.Put(p, &pr).code(), absl::StatusCode::kInvalidArgument);
}

// A store that fails on demand: the buffer must then take nothing and lose nothing.
class FailingStore : public BufferStore {
 public:
  bool fail = false;
  int added = 0;
  absl::StatusOr<uint64_t> Added(const std::vector<ExperienceBytes>& e) override {
    if (fail) return absl::UnavailableError("store down");
    added += e.size();
    return 1;
  }
  absl::Status Removed(const std::vector<StoredRef>&, const std::string&) override {
    return fail ? absl::UnavailableError("store down") : absl::OkStatus();
  }
  absl::Status SavePolicyVersion(uint64_t) override { return absl::OkStatus(); }
  absl::Status SaveConfig(const v1::ConfigureRequest&) override {
    return fail ? absl::UnavailableError("store down") : absl::OkStatus();
  }
  absl::Status Count(const std::string&, uint64_t) override { return absl::OkStatus(); }
  absl::StatusOr<BufferSnapshot> Load() override { return BufferSnapshot{}; }
};

TEST(BufferDurability, AStoreFailureTakesNothingAndKeepsTheLease) {
  FailingStore store;
  BufferCore core(common::Clock::Real(), &store);
  v1::PutExperiencesRequest put;
  *put.add_experiences() = Exp("a", "", 1);
  v1::PutExperiencesResponse r;
  store.fail = true;
  absl::Status s = core.Put(put, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  v1::GetStatsResponse stats;
  ASSERT_TRUE(core.GetStats(&stats).ok());
  EXPECT_EQ(stats.depth_experiences(), 0u);
  store.fail = false;
  v1::PutExperiencesResponse r2;
  ASSERT_TRUE(core.Put(put, &r2).ok());
  EXPECT_EQ(r2.accepted(), 1u);  // not a duplicate: the failed Put took nothing
  v1::SampleBatchRequest sample;
  sample.set_num_groups(1);
  v1::SampleBatchResponse sampled;
  ASSERT_TRUE(core.SampleBatch(sample, &sampled).ok());
  store.fail = true;
  v1::AckBatchRequest ack;
  ack.set_lease_id(sampled.lease_id());
  v1::AckBatchResponse acked;
  EXPECT_EQ(core.Ack(ack, &acked).code(), absl::StatusCode::kUnavailable);
  store.fail = false;
  ASSERT_TRUE(core.Ack(ack, &acked).ok());  // the lease was kept: the retry succeeds
  EXPECT_EQ(acked.consumed_experiences(), 1u);
}

// A store whose first write waits until released: a Put stands between its decision
// and its durable write while others run.
class GatedStore : public FailingStore {
 public:
  absl::Notification entered, release;
  bool gate = true;
  absl::StatusOr<uint64_t> Added(const std::vector<ExperienceBytes>& e) override {
    if (gate) {
      gate = false;
      entered.Notify();
      release.WaitForNotificationWithTimeout(absl::Seconds(30));
    }
    return FailingStore::Added(e);
  }
};

TEST(BufferDurability, APutBeingWrittenHoldsItsIdsGroupSlotsAndBytes) {
  GatedStore store;
  BufferCore core(common::Clock::Real(), &store);
  v1::ConfigureRequest c;
  c.set_group_size(2);
  c.set_capacity_bytes(1 << 20);
  c.set_filter_zero_variance(false);
  v1::ConfigureResponse cr;
  ASSERT_TRUE(core.Configure(c, &cr).ok());
  v1::PutExperiencesRequest first;
  *first.add_experiences() = Exp("x1", "g", 1);
  *first.add_experiences() = Exp("x2", "g", 0);
  v1::PutExperiencesResponse first_response;
  absl::Status first_status;
  std::thread writer([&] { first_status = core.Put(first, &first_response); });
  ASSERT_TRUE(store.entered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // While the first Put is being written: its ids are duplicates, its group is full,
  // and the group size cannot change.
  v1::PutExperiencesRequest second;
  *second.add_experiences() = Exp("x2", "h", 1);
  *second.add_experiences() = Exp("x3", "g", 1);
  *second.add_experiences() = Exp("x4", "h", 0);
  v1::PutExperiencesResponse second_response;
  ASSERT_TRUE(core.Put(second, &second_response).ok());
  EXPECT_EQ(second_response.duplicates(), 1u);
  EXPECT_EQ(second_response.accepted(), 1u);  // x4
  ASSERT_EQ(second_response.rejections_size(), 1);
  EXPECT_EQ(second_response.rejections(0).reason(), v1::REJECT_REASON_GROUP_FULL);
  c.set_group_size(4);
  EXPECT_EQ(core.Configure(c, &cr).code(), absl::StatusCode::kFailedPrecondition);
  store.release.Notify();
  writer.join();
  ASSERT_TRUE(first_status.ok()) << first_status;
  EXPECT_EQ(first_response.accepted(), 2u);
  v1::GetStatsResponse stats;
  ASSERT_TRUE(core.GetStats(&stats).ok());
  EXPECT_EQ(stats.accepted_total(), 3u);
  EXPECT_EQ(store.added, 3);
}

// A store whose first removal waits until released.
class GatedRemovalStore : public FailingStore {
 public:
  absl::Notification entered, release;
  std::atomic<bool> gate{true};
  absl::Status Removed(const std::vector<StoredRef>& refs, const std::string& counter) override {
    if (gate.exchange(false)) {
      entered.Notify();
      release.WaitForNotificationWithTimeout(absl::Seconds(30));
    }
    return FailingStore::Removed(refs, counter);
  }
};

// An ack being recorded in the store does not hold the buffer: a Put meanwhile is
// answered; a second Ack of the same lease waits for the first and says already_acked
// (not NOT_FOUND: its groups are not back in the buffer).
TEST(BufferDurability, AnAckBeingWrittenHoldsNeitherPutsNorItsLease) {
  GatedRemovalStore store;
  BufferCore core(common::Clock::Real(), &store);
  v1::PutExperiencesRequest put;
  *put.add_experiences() = Exp("a", "", 1);
  v1::PutExperiencesResponse r;
  ASSERT_TRUE(core.Put(put, &r).ok());
  v1::SampleBatchRequest sample;
  sample.set_num_groups(1);
  v1::SampleBatchResponse sampled;
  ASSERT_TRUE(core.SampleBatch(sample, &sampled).ok());
  ASSERT_FALSE(sampled.lease_id().empty());
  v1::AckBatchRequest ack;
  ack.set_lease_id(sampled.lease_id());
  v1::AckBatchResponse first, second;
  absl::Status first_status, second_status;
  std::thread acker([&] { first_status = core.Ack(ack, &first); });
  ASSERT_TRUE(store.entered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::Notification put_done;
  std::thread putter([&] {
    v1::PutExperiencesRequest more;
    *more.add_experiences() = Exp("b", "", 1);
    v1::PutExperiencesResponse more_response;
    EXPECT_TRUE(core.Put(more, &more_response).ok());
    EXPECT_EQ(more_response.accepted(), 1u);
    put_done.Notify();
  });
  EXPECT_TRUE(put_done.WaitForNotificationWithTimeout(absl::Seconds(10))) << "a Put waited for an ack's store write";
  std::thread again([&] { second_status = core.Ack(ack, &second); });
  store.release.Notify();
  acker.join();
  again.join();
  putter.join();
  ASSERT_TRUE(first_status.ok()) << first_status;
  EXPECT_EQ(first.consumed_experiences(), 1u);
  ASSERT_TRUE(second_status.ok()) << second_status;
  EXPECT_TRUE(second.already_acked());
  v1::GetStatsResponse stats;
  ASSERT_TRUE(core.GetStats(&stats).ok());
  EXPECT_EQ(stats.consumed_total(), 1u);
  EXPECT_EQ(stats.depth_experiences(), 1u);  // b
}

TEST(BufferDurability, ARestartedBufferRecoversEverythingNotConsumed) {
  absl::StatusOr<int> redis_port = rlfleet::testing::RedisPortForTest();
  ASSERT_TRUE(redis_port.ok()) << redis_port.status();
  const std::string port = std::to_string(*redis_port);
  const std::string connection = absl::StrCat("redis://127.0.0.1:", port, "/", common::NewId("buf"), ":");
  auto configure = [](BufferCore& core) {
    v1::ConfigureRequest c;
    c.set_group_size(2);
    v1::ConfigureResponse r;
    ASSERT_TRUE(core.Configure(c, &r).ok());
  };
  auto put = [](BufferCore& core, std::vector<v1::Experience> exps) {
    v1::PutExperiencesRequest req;
    for (auto& e : exps) *req.add_experiences() = e;
    v1::PutExperiencesResponse resp;
    EXPECT_TRUE(core.Put(req, &resp).ok());
    return resp;
  };
  {
    auto store = OpenBufferStore(connection);
    ASSERT_TRUE(store.ok()) << store.status();
    BufferCore core(common::Clock::Real(), store->get());
    configure(core);
    put(core, {Exp("a1", "A", 1), Exp("a2", "A", 0), Exp("b1", "B", 1)});
    v1::SampleBatchRequest sample;
    sample.set_num_groups(1);
    v1::SampleBatchResponse sampled;
    ASSERT_TRUE(core.SampleBatch(sample, &sampled).ok());
    v1::AckBatchRequest ack;
    ack.set_lease_id(sampled.lease_id());
    v1::AckBatchResponse acked;
    ASSERT_TRUE(core.Ack(ack, &acked).ok());  // group A consumed
    put(core, {Exp("c1", "C", 1), Exp("c2", "C", 0)});
    v1::SampleBatchResponse second;
    ASSERT_TRUE(core.SampleBatch(sample, &second).ok());  // group C leased, never acked
    ASSERT_EQ(second.groups(0).group_id(), "C");
  }  // the process "dies"
  auto store = OpenBufferStore(connection);
  ASSERT_TRUE(store.ok());
  BufferCore core(common::Clock::Real(), store->get());
  ASSERT_TRUE(core.Recover().ok());  // (not configured again: the store kept the group size)
  v1::GetStatsResponse stats;
  ASSERT_TRUE(core.GetStats(&stats).ok());
  EXPECT_EQ(stats.config().group_size(), 2u);
  EXPECT_EQ(stats.complete_groups(), 1u);  // C is back
  EXPECT_EQ(stats.partial_groups(), 1u);   // B still waits for its second member
  EXPECT_EQ(stats.depth_experiences(), 3u);
  EXPECT_EQ(stats.accepted_total(), 5u);
  EXPECT_EQ(stats.consumed_total(), 2u);
  // Ids accepted before the restart are still duplicates, consumed or not.
  auto again = put(core, {Exp("a1", "A", 1), Exp("c1", "C", 1), Exp("b2", "B", 0)});
  EXPECT_EQ(again.duplicates(), 2u);
  EXPECT_EQ(again.accepted(), 1u);
  ASSERT_TRUE(core.GetStats(&stats).ok());
  EXPECT_EQ(stats.complete_groups(), 2u);
}

TEST(BufferService, PutSampleAckOverGrpc) {
  BufferCore core;
  BufferServiceImpl service(&core, rpc::CallAuth{});
  rpc::ServerRunner runner(rpc::ServerOptions{});
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  auto stub = v1::BufferService::NewStub(grpc::CreateChannel(runner.address(), grpc::InsecureChannelCredentials()));
  auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(5); };
  v1::PutExperiencesRequest put;
  *put.add_experiences() = Exp("a", "", 1);
  v1::PutExperiencesResponse put_response;
  grpc::ClientContext c1;
  c1.set_deadline(deadline());
  ASSERT_TRUE(stub->PutExperiences(&c1, put, &put_response).ok());
  EXPECT_EQ(put_response.accepted(), 1u);
  v1::SampleBatchRequest sample;
  sample.set_num_groups(1);
  v1::SampleBatchResponse sampled;
  grpc::ClientContext c2;
  c2.set_deadline(deadline());
  ASSERT_TRUE(stub->SampleBatch(&c2, sample, &sampled).ok());
  ASSERT_EQ(sampled.groups_size(), 1);
  v1::AckBatchRequest ack;
  ack.set_lease_id(sampled.lease_id());
  v1::AckBatchResponse acked;
  grpc::ClientContext c3;
  c3.set_deadline(deadline());
  ASSERT_TRUE(stub->AckBatch(&c3, ack, &acked).ok());
  EXPECT_EQ(acked.consumed_experiences(), 1u);
  v1::SampleBatchRequest bad;  // num_groups 0
  grpc::ClientContext c4;
  c4.set_deadline(deadline());
  grpc::Status status = stub->SampleBatch(&c4, bad, &sampled);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "num_groups"));
}

// A store whose asynchronous commits are held until the test opens it (then answer as
// they come), recording how many experiences each commit carried.
class HeldCommitsStore : public FailingStore {
 public:
  void AddedAsync(const std::vector<ExperienceBytes>& e, std::function<void(absl::StatusOr<uint64_t>)> done) override {
    absl::StatusOr<uint64_t> result = Added(e);
    {
      absl::MutexLock lock(&mu_);
      commits_.push_back(static_cast<int>(e.size()));
      if (!open_) {
        held_.push_back([done = std::move(done), result] { done(result); });
        return;
      }
    }
    done(result);
  }
  // Opens the gate: the held commits answer now (on this thread).
  void Open() {
    std::vector<std::function<void()>> held;
    {
      absl::MutexLock lock(&mu_);
      open_ = true;
      held.swap(held_);
    }
    for (auto& answer : held) answer();
  }
  std::vector<int> commits() {
    absl::MutexLock lock(&mu_);
    return commits_;
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::function<void()>> held_ ABSL_GUARDED_BY(mu_);
  std::vector<int> commits_ ABSL_GUARDED_BY(mu_);
};

class BufferStreamMerging : public ::testing::Test {
 protected:
  void Start(uint64_t capacity_bytes, absl::Duration full_wait, absl::Duration linger = absl::Milliseconds(2)) {
    core_ = std::make_unique<BufferCore>(common::Clock::Real(), &store_);
    v1::ConfigureRequest config;
    config.set_group_size(1);
    config.set_capacity_bytes(capacity_bytes);
    v1::ConfigureResponse configured;
    ASSERT_TRUE(core_->Configure(config, &configured).ok());
    service_ = std::make_unique<BufferServiceImpl>(core_.get(), rpc::CallAuth{}, full_wait, linger);
    runner_ = std::make_unique<rpc::ServerRunner>(rpc::ServerOptions{});
    runner_->AddService(service_.get());
    ASSERT_TRUE(runner_->Start().ok());
    stub_ = v1::BufferService::NewStub(grpc::CreateChannel(runner_->address(), grpc::InsecureChannelCredentials()));
  }
  // Streams `messages` (`per_message` experiences each, `tokens` long) while the
  // store's first commit is held, opens the gate once the service has read them all (or
  // ended the stream), and returns the stream's status and reply.
  grpc::Status Stream(int messages, int per_message, int tokens, v1::PutExperiencesResponse* total) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto writer = stub_->StreamExperiences(&context, total);
    for (int m = 0; m < messages; ++m) {
      v1::PutExperiencesRequest message;
      for (int k = 0; k < per_message; ++k) {
        const std::string id = absl::StrCat("e", m, "-", k);
        *message.add_experiences() = Exp(id, "g" + id, 1, 1, tokens);
      }
      if (!writer->Write(message)) break;  // (the server ended the stream)
    }
    writer->WritesDone();
    OpenOnceRead(messages);
    return writer->Finish();
  }
  // Opens the store's gate once the service has read `messages` stream messages (or
  // after 20 s).
  void OpenOnceRead(int messages) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (service_->stream_messages_read() < static_cast<uint64_t>(messages) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));  // (polls a counter: no condition to await across gRPC)
    }
    store_.Open();
  }
  HeldCommitsStore store_;
  std::unique_ptr<BufferCore> core_;
  std::unique_ptr<BufferServiceImpl> service_;
  std::unique_ptr<rpc::ServerRunner> runner_;
  std::unique_ptr<v1::BufferService::Stub> stub_;
};

// Messages read while a Put waits for the store go into the next Put together: 50
// one-experience messages take a handful of commits, not 50, in order.
TEST_F(BufferStreamMerging, MessagesReadWhileAPutIsInFlightShareTheNextPut) {
  Start(uint64_t{64} << 20, absl::Seconds(1));
  v1::PutExperiencesResponse total;
  grpc::Status s = Stream(50, 1, 4, &total);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(total.accepted(), 50u);
  const std::vector<int> commits = store_.commits();
  EXPECT_EQ(std::accumulate(commits.begin(), commits.end(), 0), 50);
  EXPECT_LE(commits.size(), 10u) << "one commit per message: nothing was merged";
  v1::SampleBatchRequest sample;
  sample.set_num_groups(50);
  v1::SampleBatchResponse sampled;
  ASSERT_TRUE(core_->SampleBatch(sample, &sampled).ok());
  ASSERT_EQ(sampled.groups_size(), 50);
}

// A burst of messages that the linger outlasts is one Put when the stream's reads end
// (the linger alarm, still set, is cancelled: the stream does not wait for it).
TEST_F(BufferStreamMerging, ABurstWithinTheLingerIsOneCommit) {
  Start(uint64_t{64} << 20, absl::Seconds(1), /*linger=*/absl::Seconds(60));
  const absl::Time start = absl::Now();
  v1::PutExperiencesResponse total;
  grpc::Status s = Stream(8, 1, 4, &total);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(total.accepted(), 8u);
  EXPECT_EQ(store_.commits(), std::vector<int>{8});
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "the stream waited for its linger alarm";
}

// A message the producer does not follow up is applied after the linger, while the
// stream is still open: lingering delays an experience, it does not hold it back.
TEST_F(BufferStreamMerging, AMessageWithNoSuccessorIsAppliedAfterTheLinger) {
  Start(uint64_t{64} << 20, absl::Seconds(1), /*linger=*/absl::Milliseconds(20));
  store_.Open();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::PutExperiencesResponse total;
  auto writer = stub_->StreamExperiences(&context, &total);
  v1::PutExperiencesRequest message;
  *message.add_experiences() = Exp("alone", "galone", 1);
  ASSERT_TRUE(writer->Write(message));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  v1::GetStatsResponse stats;
  do {
    absl::SleepFor(absl::Milliseconds(1));  // (polls the buffer's depth: the condition awaited)
    ASSERT_TRUE(core_->GetStats(&stats).ok());
  } while (stats.depth_experiences() < 1 && absl::Now() < deadline);
  EXPECT_EQ(stats.depth_experiences(), 1u) << "the message waited for the stream's end";
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(total.accepted(), 1u);
}

// A merged Put the buffer cannot hold is applied again message by message: what fits
// is accepted, and the stream ends naming the first message that does not, as if each
// had been put alone.
TEST_F(BufferStreamMerging, AMergedPutThatDoesNotFitIsAppliedMessageByMessage) {
  // 1 MiB holds five messages of three ~62 KB experiences (each under capacity / 16).
  const uint64_t size = Exp("e0-0", "ge0-0", 1, 1, 8900).ByteSizeLong();
  ASSERT_LT(size, (1u << 20) / 16);
  ASSERT_LE(15 * size, 1u << 20);
  ASSERT_GT(18 * size, 1u << 20);
  Start(1 << 20, absl::Milliseconds(300));
  v1::PutExperiencesResponse total;
  grpc::Status s = Stream(10, 3, 8900, &total);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "message 5 of the stream")) << s.error_message();
  v1::GetStatsResponse stats;
  ASSERT_TRUE(core_->GetStats(&stats).ok());
  EXPECT_EQ(stats.depth_experiences(), 15u);
}

// A message that does not parse ends the stream naming it, after the messages before
// it (read while a Put was in flight) are applied.
TEST_F(BufferStreamMerging, AMessageThatDoesNotParseEndsTheStreamAfterTheOnesBeforeIt) {
  Start(uint64_t{64} << 20, absl::Seconds(1));
  auto channel = grpc::CreateChannel(runner_->address(), grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::ByteBuffer reply;
  const grpc::internal::RpcMethod method("/rlfleet.v1.BufferService/StreamExperiences",
                                         grpc::internal::RpcMethod::CLIENT_STREAMING);
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel.get(), method, &context, &reply));
  auto bytes = [](const std::string& s) {
    grpc::Slice slice(s);
    return grpc::ByteBuffer(&slice, 1);
  };
  for (int m = 0; m < 2; ++m) {
    v1::PutExperiencesRequest message;
    *message.add_experiences() = Exp(absl::StrCat("p", m), absl::StrCat("gp", m), 1);
    ASSERT_TRUE(writer->Write(bytes(message.SerializeAsString())));
  }
  const std::string cut_short = {'\x0a', '\x05', 'a', 'b'};  // (field 1: 5 bytes promised, 2 sent)
  ASSERT_TRUE(writer->Write(bytes(cut_short)));
  writer->WritesDone();
  OpenOnceRead(3);
  grpc::Status s = writer->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "message 2 of the stream")) << s.error_message();
  v1::GetStatsResponse stats;
  ASSERT_TRUE(core_->GetStats(&stats).ok());
  EXPECT_EQ(stats.depth_experiences(), 2u);
}

}  // namespace
}  // namespace rlfleet::buffer

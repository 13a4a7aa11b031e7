// The Redis buffer store against the redis-server that tools/test.sh starts
// (RLFLEET_REDIS_PORT): segments written and retired, and an accounting that a
// retried write (the reply lost after Redis committed it) cannot skew.
#include "services/buffer/buffer_store.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/common/ids.h"
#include "libs/redis/redis_client.h"
#include "tests/util/redis_for_test.h"

namespace rlfleet::buffer {
namespace {

std::string Bytes(const std::string& id) {
  v1::Experience e;
  e.mutable_experience_id()->set_value(id);
  e.add_response_token_ids(7);
  e.set_reward(1);
  return e.SerializeAsString();
}

class BufferStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> redis_port = rlfleet::testing::RedisPortForTest();
    ASSERT_TRUE(redis_port.ok()) << redis_port.status();
    port_ = *redis_port;
    const std::string port = std::to_string(port_);
    prefix_ = common::NewId("store-test") + ":";
    auto store = OpenBufferStore(absl::StrCat("redis://127.0.0.1:", port, "/", prefix_));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto redis = redis::Client::Connect("127.0.0.1", port_);
    ASSERT_TRUE(redis.ok());
    redis_ = std::move(*redis);
  }
  uint64_t Add(std::vector<std::string> ids) {
    std::vector<std::string> bytes;
    for (const auto& id : ids) bytes.push_back(Bytes(id));
    std::vector<ExperienceBytes> in;
    for (size_t i = 0; i < ids.size(); ++i) in.push_back({bytes[i]});
    auto segment = store_->Added(in);
    EXPECT_TRUE(segment.ok()) << segment.status();
    return segment.value_or(0);
  }
  std::vector<std::string> Ids(const BufferSnapshot& s) {
    std::vector<std::string> ids;
    for (const auto& e : s.experiences) {
      v1::Experience x;
      EXPECT_TRUE(x.ParseFromString(e.bytes));
      ids.push_back(x.experience_id().value());
    }
    std::sort(ids.begin(), ids.end());
    return ids;
  }
  int port_ = 0;
  std::string prefix_;
  std::unique_ptr<BufferStore> store_;
  std::unique_ptr<redis::Client> redis_;
};

TEST_F(BufferStoreTest, SegmentsComeBackAndRetireWhenEverythingInThemIsGone) {
  const uint64_t a = Add({"p", "q"});
  const uint64_t b = Add({"r"});
  ASSERT_NE(a, b);
  ASSERT_TRUE(store_->Removed({{a, "p"}}, "consumed_total").ok());
  auto s = store_->Load();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Ids(*s), (std::vector<std::string>{"q", "r"}));
  EXPECT_EQ(s->counters["accepted_total"], 3u);
  EXPECT_EQ(s->counters["consumed_total"], 1u);
  EXPECT_EQ(s->seen_ids.size(), 3u);
  ASSERT_TRUE(store_->Removed({{a, "q"}}, "dropped_zero_variance").ok());
  // Segment a is retired: its bytes are gone from Redis, its ids still count as seen.
  auto exists = redis_->Command({"EXISTS", absl::StrCat(prefix_, "seg:", a)});
  ASSERT_TRUE(exists.ok());
  EXPECT_EQ(exists->integer, 0);
  s = store_->Load();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Ids(*s), (std::vector<std::string>{"r"}));
  EXPECT_EQ(s->counters["accepted_total"], 3u);
  EXPECT_EQ(s->counters["dropped_zero_variance"], 1u);
  EXPECT_EQ(s->seen_ids.size(), 3u);
}

// On a long run the removal logs of retired segments are folded into the counters
// (all but the newest few): Redis holds a bounded number of them, and the counts a
// restarted buffer reads are exactly what they were.
TEST_F(BufferStoreTest, OldRemovalLogsAreFoldedIntoTheCountsSoTheStoreStaysBounded) {
  auto opened = OpenBufferStore(absl::StrCat("redis://127.0.0.1:", port_, "/", prefix_), /*keep_retired=*/4);
  ASSERT_TRUE(opened.ok()) << opened.status();
  BufferStore& store = **opened;
  for (int i = 0; i < 40; ++i) {
    const std::string a = absl::StrCat("e", i, "a"), b = absl::StrCat("e", i, "b");
    const std::string ba = Bytes(a), bb = Bytes(b);
    auto segment = store.Added({{ba}, {bb}});
    ASSERT_TRUE(segment.ok()) << segment.status();
    ASSERT_TRUE(store.Removed({{*segment, a}}, "consumed_total").ok());
    ASSERT_TRUE(store.Removed({{*segment, b}}, i % 4 == 0 ? "dropped_stale" : "consumed_total").ok());
  }
  const std::string held = Bytes("held");
  ASSERT_TRUE(store.Added({{held}}).ok());
  auto done = redis_->Command({"SCARD", prefix_ + "done"});
  ASSERT_TRUE(done.ok());
  EXPECT_LE(done->integer, 5);  // (4 kept, compacted once more than a quarter over)
  auto keys = redis_->Command({"KEYS", prefix_ + "gone:*"});
  ASSERT_TRUE(keys.ok());
  EXPECT_LE(keys->elements.size(), 5u);
  auto s = store.Load();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->counters["accepted_total"], 81u);
  EXPECT_EQ(s->counters["consumed_total"], 70u);
  EXPECT_EQ(s->counters["dropped_stale"], 10u);
  EXPECT_EQ(Ids(*s), (std::vector<std::string>{"held"}));
  EXPECT_LE(s->seen_ids.size(), 11u);  // the held one and the kept segments' ids
}

// What a commit whose reply was lost leaves behind (the buffer said UNAVAILABLE, the
// producer resent, the experience went into a second segment) and a removal recorded
// twice (an ack retried after an error whose write did land): each id counts once.
TEST_F(BufferStoreTest, RepeatedWritesOfAnIdCountOnce) {
  const uint64_t orphan = Add({"x", "y"});
  const uint64_t again = Add({"x"});
  auto s = store_->Load();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Ids(*s), (std::vector<std::string>{"x", "y"}));  // x once
  EXPECT_EQ(s->counters["accepted_total"], 2u);
  // x is consumed through the segment the buffer knew it by; recorded twice.
  ASSERT_TRUE(store_->Removed({{again, "x"}}, "consumed_total").ok());
  ASSERT_TRUE(store_->Removed({{again, "x"}}, "consumed_total").ok());
  s = store_->Load();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Ids(*s), (std::vector<std::string>{"y"}));  // the orphan's copy of x does not return
  EXPECT_EQ(s->counters["accepted_total"], 2u);
  EXPECT_EQ(s->counters["consumed_total"], 1u);
  (void)orphan;
}

TEST_F(BufferStoreTest, ConfigurationSurvivesAndBadRemovalsAreNamed) {
  v1::ConfigureRequest config;
  config.set_group_size(8);
  config.set_max_staleness(3);
  ASSERT_TRUE(store_->SaveConfig(config).ok());
  auto s = store_->Load();
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->config.has_value());
  EXPECT_EQ(s->config->group_size(), 8u);
  EXPECT_EQ(s->config->max_staleness(), 3u);
  // The policy version only rises, whichever write comes last.
  ASSERT_TRUE(store_->SavePolicyVersion(7).ok());
  ASSERT_TRUE(store_->SavePolicyVersion(5).ok());
  EXPECT_EQ(store_->Load()->policy_version, 7u);
  const std::string newer = Bytes("v");
  ASSERT_TRUE(store_->Added({{newer, 9}}).ok());
  EXPECT_EQ(store_->Load()->policy_version, 9u);
  const uint64_t a = Add({"k"});
  absl::Status bad = store_->Removed({{a, "k"}}, "dropped_for_fun");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("dropped_for_fun"), absl::string_view::npos);
}

bool Names(const std::vector<std::string>& skipped, const std::string& what) {
  for (const std::string& s : skipped) {
    if (s.find(what) != std::string::npos) return true;
  }
  return false;
}

// Records garbled in Redis (by hand here) are left out and named, one by one; what
// reads is still recovered, and Load never fails for them.
TEST_F(BufferStoreTest, CorruptRecordsAreSkippedAndNamed) {
  const uint64_t a = Add({"good1", "good2"});
  const std::string seg = absl::StrCat(prefix_, "seg:", a);
  // A record that frames well but is not an Experience, then a cut-off record.
  std::string not_experience;
  not_experience.push_back(3);
  not_experience += "\xff\xff\xff";
  ASSERT_TRUE(redis_->Command({"APPEND", seg, not_experience}).ok());
  const uint64_t b = Add({"good3"});
  ASSERT_TRUE(redis_->Command({"APPEND", absl::StrCat(prefix_, "seg:", b), "\x7fzz"}).ok());
  ASSERT_TRUE(redis_->Command({"SADD", prefix_ + "segs", "not-a-number"}).ok());
  ASSERT_TRUE(redis_->Command({"SET", prefix_ + "config", "\xff\xff garbage"}).ok());
  ASSERT_TRUE(redis_->Command({"ZADD", prefix_ + "policy_version", "1e300", "policy"}).ok());
  ASSERT_TRUE(redis_->Command({"APPEND", absl::StrCat(prefix_, "gone:", a), "\x02?x"}).ok());
  auto s = store_->Load();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Ids(*s), (std::vector<std::string>{"good1", "good2", "good3"}));
  EXPECT_TRUE(Names(s->skipped, absl::StrCat(seg, "` record 2 is not a serialized Experience"))) << s->skipped[0];
  EXPECT_TRUE(Names(s->skipped, absl::StrCat(prefix_, "seg:", b, "` is cut or garbled")));
  EXPECT_TRUE(Names(s->skipped, "not-a-number"));
  EXPECT_TRUE(Names(s->skipped, prefix_ + "config"));
  EXPECT_TRUE(Names(s->skipped, prefix_ + "policy_version"));
  EXPECT_TRUE(Names(s->skipped, absl::StrCat(prefix_, "gone:", a, "` record 0 has no known reason")));
  EXPECT_EQ(s->skipped.size(), 6u);
  EXPECT_FALSE(s->config.has_value());
  EXPECT_EQ(s->policy_version, 0u);
}

}  // namespace
}  // namespace rlfleet::buffer

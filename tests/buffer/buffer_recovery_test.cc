// The buffer's durability through real processes and a real redis-server of the
// test's own (random loopback port, AOF on):
//   - kill -9 of the buffer mid-ingest, restarted on the same store: the accounting is
//     exact (accepted = consumed + dropped by reason + still buffered), every id is
//     accepted once, and every acknowledged experience is trained on or dropped by its
//     policy;
//   - kill -9 of Redis mid-run (appendfsync always), restarted on its AOF: ingest and
//     acks resume after UNAVAILABLE, nothing acknowledged is lost (a buffer restarted
//     from that Redis reports the same accounting);
//   - records garbled in Redis by hand: the buffer still starts, recovers what reads and
//     names each record it skipped.
// Producers resend what they have not seen acknowledged, as the API tells them to.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/redis/redis_client.h"
#include "rlfleet/v1/buffer.grpc.pb.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

using testing::StartService;
using testing::Subprocess;

constexpr uint64_t kVersion = 5;        // what most experiences were generated with
constexpr uint64_t kSampleVersion = 6;  // the trainer's version when it samples
constexpr uint32_t kMaxStaleness = 2;

// What a group is made to be: trained on, dropped for zero variance, dropped as stale
// when sampled (version 3: within the bound at Put, beyond it at version 6), or
// rejected at Put (version 1: beyond the bound already).
enum class Kind { kTrained, kZeroVariance, kStaleLater, kTooOld };

Kind KindOf(int group) {
  switch (group % 6) {
    case 3:
      return Kind::kZeroVariance;
    case 4:
      return Kind::kStaleLater;
    case 5:
      return Kind::kTooOld;
    default:
      return Kind::kTrained;
  }
}

// Message m: 4 groups of 2 experiences.
v1::PutExperiencesRequest Message(int m) {
  v1::PutExperiencesRequest r;
  for (int g = 0; g < 4; ++g) {
    const int group = m * 4 + g;
    const Kind kind = KindOf(group);
    const uint64_t version = kind == Kind::kStaleLater ? 3 : kind == Kind::kTooOld ? 1 : kVersion;
    for (int j = 0; j < 2; ++j) {
      v1::Experience* e = r.add_experiences();
      e->mutable_experience_id()->set_value(absl::StrCat("e", group, "-", j));
      e->set_group_id(absl::StrCat("g", group));
      e->set_prompt_id(absl::StrCat("p", group));
      e->set_reward(kind == Kind::kZeroVariance ? 1.0f : static_cast<float>(j));
      for (int t = 0; t < 8; ++t) {
        e->add_response_token_ids(30000 + t);
        e->add_response_logprobs(-0.5f);
        e->add_token_policy_versions(version);
      }
    }
  }
  return r;
}

// Where the buffer is now (it moves when restarted).
class Endpoint {
 public:
  void Set(const std::string& address) {
    absl::MutexLock lock(&mu_);
    address_ = address;
    stub_ = v1::BufferService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  std::shared_ptr<v1::BufferService::Stub> Stub() {
    absl::MutexLock lock(&mu_);
    return stub_;
  }

 private:
  absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<v1::BufferService::Stub> stub_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<grpc::ClientContext> Context(int seconds = 5) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return c;
}

// Sends messages 0..count-1 in order by unary PutExperiences, each until it is answered
// (resending after any error), and records each id's first answer.
class Producer {
 public:
  Producer(Endpoint* endpoint, int count) : endpoint_(endpoint), count_(count) {}
  ~Producer() {
    if (thread_.joinable()) thread_.join();
  }
  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  void Join() { thread_.join(); }
  int done() const { return done_.load(); }
  bool finished() const { return done_.load() == count_; }
  std::string failure() const { return failure_; }  // after Join

  // Ids accepted exactly once by the buffer: answered accepted, or answered duplicate
  // on a resend after a send whose answer was lost (that send took them).
  std::map<Kind, std::set<std::string>> Accepted() const {
    std::map<Kind, std::set<std::string>> out;
    for (const auto& [id, s] : ids_) {
      if (s.answer == "accepted" || (s.answer == "duplicate" && s.lost)) out[s.kind].insert(id);
    }
    return out;
  }
  std::map<std::string, int> Answers() const {
    std::map<std::string, int> out;
    for (const auto& [id, s] : ids_) ++out[s.answer + (s.kind == Kind::kTooOld ? "/too-old" : "")];
    return out;
  }
  int resends() const { return resends_; }

 private:
  struct IdState {
    Kind kind = Kind::kTrained;
    std::string answer;  // "accepted", "duplicate", "rejected:<reason>"
    bool lost = false;   // a send of it went unanswered before
  };

  void Run() {
    const absl::Time give_up = absl::Now() + absl::Seconds(120);
    for (int m = 0; m < count_; ++m) {
      const v1::PutExperiencesRequest request = Message(m);
      for (;;) {
        if (absl::Now() > give_up) {
          failure_ = absl::StrCat("message ", m, " never answered");
          return;
        }
        auto context = Context();
        v1::PutExperiencesResponse response;
        grpc::Status s = endpoint_->Stub()->PutExperiences(context.get(), request, &response);
        if (s.ok()) {
          Record(m, request, response);
          break;
        }
        if (s.error_code() != grpc::StatusCode::UNAVAILABLE && s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
          failure_ = absl::StrCat("message ", m, ": unexpected ", s.error_code(), " ", s.error_message());
          return;
        }
        for (const auto& e : request.experiences()) ids_[e.experience_id().value()].lost = true;
        ++resends_;
        absl::SleepFor(absl::Milliseconds(20));  // (a producer's retry backoff)
      }
      done_.store(m + 1);
    }
  }

  void Record(int m, const v1::PutExperiencesRequest& request, const v1::PutExperiencesResponse& response) {
    std::set<std::string> duplicates;
    for (const auto& d : response.duplicate_ids()) duplicates.insert(d.value());
    std::map<int, v1::RejectReason> rejected;
    for (const auto& r : response.rejections()) rejected[r.index()] = r.reason();
    for (int i = 0; i < request.experiences_size(); ++i) {
      IdState& s = ids_[request.experiences(i).experience_id().value()];
      s.kind = KindOf(m * 4 + i / 2);
      if (!s.answer.empty()) continue;
      if (duplicates.count(request.experiences(i).experience_id().value())) {
        s.answer = "duplicate";
      } else if (rejected.count(i)) {
        s.answer = absl::StrCat("rejected:", v1::RejectReason_Name(rejected[i]));
      } else {
        s.answer = "accepted";
      }
    }
  }

  Endpoint* const endpoint_;
  const int count_;
  std::thread thread_;
  std::atomic<int> done_{0};
  std::map<std::string, IdState> ids_;  // (the producer thread's until Join)
  int resends_ = 0;
  std::string failure_;
};

// Samples and acks; an ack that fails UNAVAILABLE is retried (the lease stays open).
class Consumer {
 public:
  explicit Consumer(Endpoint* endpoint) : endpoint_(endpoint) {}
  // One sample (waiting up to wait_ms) and its ack; the number of experiences acked.
  int Step(int wait_ms = 100) {
    auto context = Context(10);
    v1::SampleBatchRequest sample;
    sample.set_num_groups(16);
    sample.set_wait_ms(wait_ms);
    sample.set_current_policy_version(kSampleVersion);
    v1::SampleBatchResponse batch;
    if (!endpoint_->Stub()->SampleBatch(context.get(), sample, &batch).ok() || batch.lease_id().empty()) return 0;
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (absl::Now() < give_up) {
      auto ack_context = Context();
      v1::AckBatchRequest ack;
      ack.set_lease_id(batch.lease_id());
      v1::AckBatchResponse acked;
      grpc::Status s = endpoint_->Stub()->AckBatch(ack_context.get(), ack, &acked);
      if (s.ok()) {
        int n = 0;
        for (const auto& g : batch.groups()) {
          for (const auto& e : g.experiences()) {
            acked_.push_back(e.experience_id().value());
            ++n;
          }
        }
        return n;
      }
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) return 0;  // expired: its groups are back
      absl::SleepFor(absl::Milliseconds(20));                       // (retry backoff)
    }
    return 0;
  }
  // Steps until `empty_rounds` samples in a row find nothing.
  void Drain(int empty_rounds = 3) {
    for (int empty = 0; empty < empty_rounds;) empty = Step(300) == 0 ? empty + 1 : 0;
  }
  const std::vector<std::string>& acked() const { return acked_; }

 private:
  Endpoint* const endpoint_;
  std::vector<std::string> acked_;
};

class BufferRecovery : public ::testing::Test {
 protected:
  void StartRedis(const std::string& fsync) {
    if (redis_port_ == 0) {
      redis_port_ = rlfleet::testing::FreeLoopbackPort();
      dir_ = absl::StrCat(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp", "/redis-", redis_port_);
      ASSERT_EQ(system(absl::StrCat("mkdir -p ", dir_).c_str()), 0);
    }
    redis_ = std::make_unique<Subprocess>();
    ASSERT_TRUE(redis_
                    ->Start({"/usr/bin/redis-server", "--bind", "127.0.0.1", "--port", absl::StrCat(redis_port_),
                             "--dir", dir_, "--save", "", "--appendonly", "yes", "--appendfsync", fsync})
                    .ok());
    ASSERT_TRUE(redis_
                    ->WaitForLine([](const std::string& l) { return absl::StrContains(l, "Ready to accept"); },
                                  absl::Seconds(20))
                    .ok());
  }
  void StartBuffer() {
    buffer_ = std::make_unique<Subprocess>();
    auto address = StartService(*buffer_, "services/buffer/rlfleet-buffer",
                                {absl::StrCat("--store=redis://127.0.0.1:", redis_port_, "/recovery:")});
    ASSERT_TRUE(address.ok()) << address.status();
    endpoint_.Set(*address);
  }
  void Kill(std::unique_ptr<Subprocess>& p) {
    ASSERT_TRUE(p->Signal(SIGKILL).ok());
    ASSERT_TRUE(p->Wait(absl::Seconds(10)).ok());
  }
  void Configure() {
    v1::ConfigureRequest c;
    c.set_group_size(2);
    c.set_max_staleness(kMaxStaleness);
    c.set_filter_zero_variance(true);
    v1::ConfigureResponse r;
    auto context = Context();
    grpc::Status s = endpoint_.Stub()->Configure(context.get(), c, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  v1::GetStatsResponse Stats() {
    v1::GetStatsResponse stats;
    auto context = Context();
    grpc::Status s = endpoint_.Stub()->GetStats(context.get(), {}, &stats);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return stats;
  }
  static void ExpectBalanced(const v1::GetStatsResponse& s, const std::string& when) {
    EXPECT_EQ(s.accepted_total(), s.consumed_total() + s.dropped().stale() + s.dropped().zero_variance() +
                                      s.depth_experiences() + s.leased_experiences())
        << when << ": " << s.ShortDebugString();
  }
  // The end state every scenario must reach, once everything is sent and drained.
  void ExpectExactAccounting(const Producer& producer, const Consumer& consumer) {
    auto accepted = producer.Accepted();
    const v1::GetStatsResponse s = Stats();
    ExpectBalanced(s, "drained");
    const uint64_t trained = accepted[Kind::kTrained].size(), zero = accepted[Kind::kZeroVariance].size(),
                   stale = accepted[Kind::kStaleLater].size();
    EXPECT_EQ(s.accepted_total(), trained + zero + stale) << s.ShortDebugString();
    EXPECT_EQ(s.consumed_total(), trained);
    EXPECT_EQ(s.dropped().zero_variance(), zero);
    EXPECT_EQ(s.dropped().stale(), stale);
    EXPECT_EQ(s.depth_experiences() + s.leased_experiences(), 0u);
    EXPECT_TRUE(accepted[Kind::kTooOld].empty());
    // Every experience trained on is one the producer had acknowledged, exactly once.
    std::set<std::string> acked(consumer.acked().begin(), consumer.acked().end());
    EXPECT_EQ(acked.size(), consumer.acked().size()) << "an experience was consumed twice";
    EXPECT_EQ(acked, accepted[Kind::kTrained]);
  }

  int redis_port_ = 0;
  std::string dir_;
  std::unique_ptr<Subprocess> redis_, buffer_;
  Endpoint endpoint_;
};

TEST_F(BufferRecovery, KillNineMidIngestLosesNothingAndCountsExactly) {
  StartRedis("everysec");
  StartBuffer();
  Configure();
  Producer producer(&endpoint_, 1200);  // (enough that the kill lands mid-ingest under any load)
  producer.Start();
  Consumer consumer(&endpoint_);
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while ((consumer.acked().size() < 40 || producer.done() < 50) && absl::Now() < give_up) consumer.Step();
  ASSERT_GE(consumer.acked().size(), 40u);
  ASSERT_FALSE(producer.finished()) << "the kill must land mid-ingest";
  Kill(buffer_);  // the producer is mid-stream; no ack is in flight

  StartBuffer();  // the same store; no Configure: the buffer recovers its own
  const v1::GetStatsResponse after = Stats();
  ExpectBalanced(after, "after the restart");
  EXPECT_EQ(after.config().group_size(), 2u);
  EXPECT_EQ(after.consumed_total(), consumer.acked().size());
  EXPECT_EQ(after.leased_experiences(), 0u);  // leases are not kept: what was leased is back
  producer.Join();
  ASSERT_EQ(producer.failure(), "");
  EXPECT_GT(producer.resends(), 0) << "no send was cut off by the kill";
  // A resend of something long acknowledged is a duplicate, counted and not re-added.
  auto context = Context();
  v1::PutExperiencesResponse again;
  ASSERT_TRUE(endpoint_.Stub()->PutExperiences(context.get(), Message(0), &again).ok());
  EXPECT_EQ(again.duplicates() + again.rejected(), 8u);
  EXPECT_EQ(again.accepted(), 0u);
  consumer.Drain();
  ExpectExactAccounting(producer, consumer);
  Kill(buffer_);
  Kill(redis_);
}

TEST_F(BufferRecovery, RedisKilledMidRunLosesNothingAcknowledged) {
  StartRedis("always");  // an acknowledged write is on disk before Redis replies
  StartBuffer();
  Configure();
  Producer producer(&endpoint_, 1200);  // (enough that the kill lands mid-ingest under any load)
  producer.Start();
  Consumer consumer(&endpoint_);
  std::atomic<bool> producing{true};
  std::thread trainer([&] {
    while (producing.load()) consumer.Step();
    consumer.Drain();
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (producer.done() < 50 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_FALSE(producer.finished()) << "the kill must land mid-run";
  Kill(redis_);
  // While Redis is down the buffer answers UNAVAILABLE and takes nothing; the producer
  // and the trainer retry.
  auto context = Context();
  v1::PutExperiencesResponse during;
  grpc::Status down = endpoint_.Stub()->PutExperiences(context.get(), Message(1000), &during);
  EXPECT_EQ(down.error_code(), grpc::StatusCode::UNAVAILABLE) << down.error_message();
  StartRedis("always");  // the same port and AOF
  producer.Join();
  ASSERT_EQ(producer.failure(), "");
  producing.store(false);
  trainer.join();
  EXPECT_GT(producer.resends(), 0) << "no send hit the outage";
  ExpectExactAccounting(producer, consumer);
  const v1::GetStatsResponse before = Stats();

  // Nothing acknowledged was lost: a buffer that knows only what Redis kept agrees.
  Kill(buffer_);
  StartBuffer();
  const v1::GetStatsResponse recovered = Stats();
  EXPECT_EQ(recovered.accepted_total(), before.accepted_total());
  EXPECT_EQ(recovered.consumed_total(), before.consumed_total());
  EXPECT_EQ(recovered.dropped().stale(), before.dropped().stale());
  EXPECT_EQ(recovered.dropped().zero_variance(), before.dropped().zero_variance());
  EXPECT_EQ(recovered.depth_experiences(), 0u);
  Kill(buffer_);
  Kill(redis_);
}

// One bad stored record must not keep the buffer from starting: it is skipped, counted
// and logged naming its key; every record that reads comes back.
TEST_F(BufferRecovery, CorruptStoredRecordsAreSkippedNotFatal) {
  StartRedis("everysec");
  StartBuffer();
  Configure();
  auto context = Context();
  v1::PutExperiencesResponse put;
  ASSERT_TRUE(endpoint_.Stub()->PutExperiences(context.get(), Message(0), &put).ok());
  const uint32_t accepted = put.accepted();
  ASSERT_GT(accepted, 0u);
  Kill(buffer_);

  auto redis = redis::Client::Connect("127.0.0.1", redis_port_);
  ASSERT_TRUE(redis.ok()) << redis.status();
  auto segments = (*redis)->Command({"SMEMBERS", "recovery:segs"});
  ASSERT_TRUE(segments.ok());
  ASSERT_EQ(segments->elements.size(), 1u);
  const std::string segment = "recovery:seg:" + segments->elements[0].str;
  ASSERT_TRUE((*redis)->Command({"APPEND", segment, std::string("\x03\xff\xff\xff", 4)}).ok());
  ASSERT_TRUE((*redis)->Command({"SET", "recovery:seg:999999", std::string("\x7f\x01", 2)}).ok());
  ASSERT_TRUE((*redis)->Command({"SADD", "recovery:segs", "999999", "not-a-segment"}).ok());

  StartBuffer();  // (before: "recovering from --store: DATA_LOSS", exit 1)
  const std::string& log = buffer_->output();
  EXPECT_TRUE(absl::StrContains(log, absl::StrCat("`", segment, "` record ", accepted, " is not a serialized"))) << log;
  EXPECT_TRUE(absl::StrContains(log, "`recovery:seg:999999` is cut or garbled")) << log;
  EXPECT_TRUE(absl::StrContains(log, "not-a-segment")) << log;
  EXPECT_TRUE(absl::StrContains(log, "recovery skipped 3 stored record(s)")) << log;
  const v1::GetStatsResponse stats = Stats();
  EXPECT_EQ(stats.accepted_total(), accepted);
  EXPECT_EQ(stats.depth_experiences(), accepted);
  EXPECT_EQ(stats.config().group_size(), 2u);
  Kill(buffer_);
  Kill(redis_);
}

}  // namespace
}  // namespace rlfleet

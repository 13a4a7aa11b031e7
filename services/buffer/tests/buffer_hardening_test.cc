// Bad input and shared state through the buffer's real RPC (BufferServiceImpl on a
// loopback server): every number of every request is range-checked in its own type and
// refused naming its field; no caller can poison what every other caller sees (a
// version, a group no reply can hold, a 1 ms lease); NaN is refused wherever it could
// reach an advantage; and a write Redis refused inside MULTI/EXEC is never acked.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "libs/common/ids.h"
#include "libs/redis/redis_client.h"
#include "libs/rpc/server_runner.h"
#include "services/buffer/buffer_core.h"
#include "services/buffer/buffer_service.h"
#include "services/buffer/tests/test_experience.h"
#include "tests/util/redis_for_test.h"

namespace rlfleet::buffer {
namespace {

// An experience of about `bytes` bytes (in token ids of 3 bytes each, with logprobs).
v1::Experience Big(const std::string& id, const std::string& group, float reward, size_t bytes) {
  return Exp(id, group, reward, 1, static_cast<int>(bytes / 8));
}

class BufferOverGrpc : public ::testing::Test {
 protected:
  void Start(BufferStore* store = nullptr) {
    core_ = std::make_unique<BufferCore>(common::Clock::Real(), store);
    service_ = std::make_unique<BufferServiceImpl>(core_.get(), rpc::CallAuth{});
    runner_ = std::make_unique<rpc::ServerRunner>(rpc::ServerOptions{});
    runner_->AddService(service_.get());
    ASSERT_TRUE(runner_->Start().ok());
    // A channel with gRPC's default receive limit (4 MiB), as a Python client has.
    stub_ = v1::BufferService::NewStub(grpc::CreateChannel(runner_->address(), grpc::InsecureChannelCredentials()));
  }
  void SetUp() override { Start(); }
  std::unique_ptr<grpc::ClientContext> Context() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return c;
  }
  grpc::Status Configure(const v1::ConfigureRequest& c) {
    v1::ConfigureResponse r;
    return stub_->Configure(Context().get(), c, &r);
  }
  grpc::Status Configure(uint32_t group_size, std::optional<uint32_t> max_staleness = {},
                         uint64_t capacity = 256 << 20) {
    v1::ConfigureRequest c;
    c.set_group_size(group_size);
    if (max_staleness) c.set_max_staleness(*max_staleness);
    c.set_capacity_bytes(capacity);
    c.set_filter_zero_variance(false);
    return Configure(c);
  }
  grpc::Status Put(std::vector<v1::Experience> exps, v1::PutExperiencesResponse* response,
                   const std::string& run_id = "") {
    v1::PutExperiencesRequest req;
    req.set_run_id(run_id);
    for (auto& e : exps) *req.add_experiences() = std::move(e);
    return stub_->PutExperiences(Context().get(), req, response);
  }
  grpc::Status Sample(v1::SampleBatchRequest req, v1::SampleBatchResponse* response) {
    if (req.num_groups() == 0) req.set_num_groups(1024);
    return stub_->SampleBatch(Context().get(), req, response);
  }
  v1::SampleBatchResponse SampleAt(uint64_t current) {
    v1::SampleBatchRequest req;
    req.set_current_policy_version(current);
    v1::SampleBatchResponse r;
    grpc::Status s = Sample(req, &r);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return r;
  }
  grpc::Status Ack(const std::string& lease, v1::AckBatchResponse* response) {
    v1::AckBatchRequest req;
    req.set_lease_id(lease);
    return stub_->AckBatch(Context().get(), req, response);
  }
  v1::GetStatsResponse Stats() {
    v1::GetStatsResponse s;
    EXPECT_TRUE(stub_->GetStats(Context().get(), {}, &s).ok());
    return s;
  }
  static void ExpectInvalid(const grpc::Status& s, const std::string& field) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), field)) << s.error_message() << " does not name " << field;
  }

  std::unique_ptr<BufferCore> core_;
  std::unique_ptr<BufferServiceImpl> service_;
  std::unique_ptr<rpc::ServerRunner> runner_;
  std::unique_ptr<v1::BufferService::Stub> stub_;
};

// PutExperiences and SampleBatch are served raw (read and answered in wire form): bytes
// that are not a request are INVALID_ARGUMENT saying so, the buffer serves on, and what
// SampleBatch answers reads as a SampleBatchResponse holding the experience as put.
TEST_F(BufferOverGrpc, BytesThatAreNotARequestAreRefusedByName) {
  grpc::GenericStub generic(grpc::CreateChannel(runner_->address(), grpc::InsecureChannelCredentials()));
  for (const char* method : {"PutExperiences", "SampleBatch"}) {
    for (const std::string& bytes : {std::string("\xff\xff\xff\xff", 4), std::string("\x0a\x7f\x01", 3)}) {
      grpc::Slice slice(bytes);
      grpc::ByteBuffer request(&slice, 1);
      grpc::ByteBuffer reply;
      grpc::ClientContext context;
      absl::Notification done;
      grpc::Status status;
      generic.UnaryCall(&context, absl::StrCat("/rlfleet.v1.BufferService/", method), grpc::StubOptions(), &request,
                        &reply, [&](grpc::Status s) {
                          status = std::move(s);
                          done.Notify();
                        });
      ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
      EXPECT_TRUE(absl::StrContains(status.error_message(), absl::StrCat("not a ", method, "Request")))
          << status.error_message();
    }
  }
  const v1::Experience sent = Exp("after-garbage", "", 1, 1);
  v1::PutExperiencesResponse r;
  EXPECT_TRUE(Put({sent}, &r).ok());
  EXPECT_EQ(r.accepted(), 1u);
  v1::SampleBatchRequest sample;
  sample.set_num_groups(1);
  v1::SampleBatchResponse batch;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ASSERT_TRUE(stub_->SampleBatch(&context, sample, &batch).ok());
  ASSERT_EQ(batch.groups_size(), 1);
  ASSERT_EQ(batch.groups(0).experiences_size(), 1);
  EXPECT_EQ(batch.groups(0).experiences(0).SerializeAsString(), sent.SerializeAsString());
  EXPECT_FALSE(batch.lease_id().empty());
}

// An experience claiming version 2^64-1 (or far ahead of any version the buffer knows)
// is refused by name, and does not make every later group stale.
TEST_F(BufferOverGrpc, AnAbsurdExperienceVersionPoisonsNothing) {
  ASSERT_TRUE(Configure(1, /*max_staleness=*/2).ok());
  v1::PutExperiencesResponse r;
  ASSERT_TRUE(Put({Exp("honest-5", "", 1, 5)}, &r).ok());
  ASSERT_EQ(r.accepted(), 1u);
  ASSERT_TRUE(Put({Exp("max", "", 1, std::numeric_limits<uint64_t>::max()), Exp("ahead", "", 1, 5 + 17),
                   Exp("near", "", 1, 5 + 2)},
                  &r)
                  .ok());
  EXPECT_EQ(r.accepted(), 1u);  // near
  ASSERT_EQ(r.rejections_size(), 2);
  for (const auto& rejection : r.rejections()) {
    EXPECT_EQ(rejection.reason(), v1::REJECT_REASON_INVALID);
    EXPECT_TRUE(absl::StrContains(rejection.message(), "token_policy_versions")) << rejection.message();
  }
  // Honest experiences of the versions around keep flowing and are sampled, not stale.
  ASSERT_TRUE(Put({Exp("honest-6", "", 1, 6)}, &r).ok());
  EXPECT_EQ(r.accepted(), 1u);
  auto s = SampleAt(7);
  EXPECT_EQ(s.groups_size(), 3);
  EXPECT_EQ(s.dropped_stale_groups(), 0u);
  EXPECT_EQ(Stats().current_policy_version(), 7u);
}

// A SampleBatch claiming version 2^64-1 is refused by name; the shared version does not
// move, and later groups are not dropped as stale.
TEST_F(BufferOverGrpc, AnAbsurdSampleBatchVersionPoisonsNothing) {
  ASSERT_TRUE(Configure(1, /*max_staleness=*/1).ok());
  v1::PutExperiencesResponse r;
  ASSERT_TRUE(Put({Exp("a", "", 1, 3)}, &r).ok());
  v1::SampleBatchRequest bad;
  v1::SampleBatchResponse sampled;
  for (uint64_t v : {std::numeric_limits<uint64_t>::max(), kMaxPolicyVersion + 1, uint64_t{3} + kMaxVersionLead + 1}) {
    bad.set_current_policy_version(v);
    ExpectInvalid(Sample(bad, &sampled), "current_policy_version");
  }
  EXPECT_EQ(Stats().current_policy_version(), 3u);
  ASSERT_TRUE(Put({Exp("b", "", 1, 4)}, &r).ok());
  EXPECT_EQ(r.accepted(), 1u);
  auto s = SampleAt(4);
  EXPECT_EQ(s.groups_size(), 2);
  EXPECT_EQ(s.dropped_stale_groups(), 0u);
}

// A group that no reply could hold is refused at Put (it would never leave the front
// of the queue); replies are sized to stay under the 4 MiB a default client takes, the
// rest waiting for the next SampleBatch.
TEST_F(BufferOverGrpc, RepliesStayUnderTheMessageLimitAndNoGroupOutgrowsOne) {
  ASSERT_TRUE(Configure(2, {}, /*capacity=*/1ull << 30).ok());
  v1::PutExperiencesResponse r;
  ASSERT_TRUE(Put({Big("g1", "G", 1, 2500 << 10), Big("g2", "G", 0, 2500 << 10)}, &r).ok());
  EXPECT_EQ(r.accepted(), 1u);
  ASSERT_EQ(r.rejections_size(), 1);
  EXPECT_EQ(r.rejections(0).reason(), v1::REJECT_REASON_TOO_LARGE);
  EXPECT_TRUE(absl::StrContains(r.rejections(0).message(), "group_id `G`")) << r.rejections(0).message();
  // Alone, one experience above a reply is refused as well (group_size 1).
  Start();
  ASSERT_TRUE(Configure(1, {}, /*capacity=*/1ull << 30).ok());
  ASSERT_TRUE(Put({Big("huge", "", 1, 5 << 20)}, &r).ok());
  ASSERT_EQ(r.rejections_size(), 1);
  EXPECT_EQ(r.rejections(0).reason(), v1::REJECT_REASON_TOO_LARGE);
  // Six groups of ~1 MiB: no reply over 4 MiB, every group delivered, none stuck.
  for (int i = 0; i < 6; i += 2) {
    ASSERT_TRUE(
        Put({Big(absl::StrCat("m", i), "", 1, 1 << 20), Big(absl::StrCat("m", i + 1), "", 0, 1 << 20)}, &r).ok());
    ASSERT_EQ(r.accepted(), 2u);
  }
  int delivered = 0;
  for (int call = 0; call < 6 && delivered < 6; ++call) {
    v1::SampleBatchResponse s;
    grpc::Status status = Sample({}, &s);
    ASSERT_TRUE(status.ok()) << status.error_message();  // (a reply over 4 MiB fails here)
    ASSERT_GT(s.groups_size(), 0);
    EXPECT_LE(s.ByteSizeLong(), kMaxReplyBytes);
    delivered += s.groups_size();
  }
  EXPECT_EQ(delivered, 6);
}

// Lease durations and the other numbers of ConfigureRequest / SampleBatchRequest are
// bounded in their own types and refused naming the field.
TEST_F(BufferOverGrpc, EveryNumberIsBoundedAndNamed) {
  v1::ConfigureRequest c;
  c.set_group_size(2);
  for (int64_t ttl : {int64_t{1}, int64_t{999}, int64_t{600001}, int64_t{-5}, std::numeric_limits<int64_t>::max()}) {
    c.set_default_lease_ttl_ms(ttl);
    ExpectInvalid(Configure(c), "default_lease_ttl_ms");
  }
  c.set_default_lease_ttl_ms(0);
  for (float eps : {std::nanf(""), INFINITY, -1.0f}) {
    c.set_zero_variance_epsilon(eps);
    ExpectInvalid(Configure(c), "zero_variance_epsilon");
  }
  c.set_zero_variance_epsilon(0);
  for (uint64_t capacity : {uint64_t{1000}, std::numeric_limits<uint64_t>::max()}) {
    c.set_capacity_bytes(capacity);
    ExpectInvalid(Configure(c), "capacity_bytes");
  }
  c.set_capacity_bytes(0);
  c.set_group_size(0);
  ExpectInvalid(Configure(c), "group_size");
  c.set_group_size(4096);
  ExpectInvalid(Configure(c), "group_size");
  c.set_group_size(2);
  c.set_default_lease_ttl_ms(1000);
  ASSERT_TRUE(Configure(c).ok());
  EXPECT_EQ(Stats().config().default_lease_ttl_ms(), 1000);

  v1::SampleBatchRequest s;
  v1::SampleBatchResponse sampled;
  s.set_num_groups(1);
  for (int64_t ttl : {int64_t{1}, int64_t{600001}, int64_t{-1}}) {
    s.set_lease_ttl_ms(ttl);
    ExpectInvalid(Sample(s, &sampled), "lease_ttl_ms");
  }
  s.set_lease_ttl_ms(0);
  for (int64_t wait : {int64_t{-1}, std::numeric_limits<int64_t>::max()}) {
    s.set_wait_ms(wait);
    ExpectInvalid(Sample(s, &sampled), "wait_ms");
  }
  s.set_wait_ms(0);
  s.set_num_groups(std::numeric_limits<uint32_t>::max());
  ExpectInvalid(Sample(s, &sampled), "num_groups");
  s.set_num_groups(1);
  s.set_min_groups(2);
  ExpectInvalid(Sample(s, &sampled), "min_groups");

  v1::AckBatchResponse acked;
  ExpectInvalid(Ack("", &acked), "lease_id");
  v1::NackBatchRequest nack;
  v1::NackBatchResponse nacked;
  ExpectInvalid(stub_->NackBatch(Context().get(), nack, &nacked), "lease_id");
}

// A NaN or infinite reward, reward component or logprob is refused naming the field
// (it would make its group's mean, std and every advantage NaN); the group's other
// members still make a finite group.
TEST_F(BufferOverGrpc, NonFiniteNumbersInExperiencesAreRefusedByName) {
  ASSERT_TRUE(Configure(2).ok());
  v1::Experience nan_reward = Exp("n1", "G", std::nanf(""));
  v1::Experience inf_component = Exp("n2", "G", 1);
  (*inf_component.mutable_reward_components())["exact"] = INFINITY;
  v1::Experience nan_logprob = Exp("n3", "G", 1);
  nan_logprob.set_response_logprobs(1, std::nanf(""));
  v1::PutExperiencesResponse r;
  ASSERT_TRUE(Put({nan_reward, inf_component, nan_logprob, Exp("ok1", "G", 1), Exp("ok2", "G", 0)}, &r).ok());
  EXPECT_EQ(r.accepted(), 2u);
  ASSERT_EQ(r.rejections_size(), 3);
  EXPECT_TRUE(absl::StrContains(r.rejections(0).message(), "reward is nan")) << r.rejections(0).message();
  EXPECT_TRUE(absl::StrContains(r.rejections(1).message(), "reward_components[\"exact\"] is inf"));
  EXPECT_TRUE(absl::StrContains(r.rejections(2).message(), "response_logprobs[1] is nan"));
  auto s = SampleAt(1);
  ASSERT_EQ(s.groups_size(), 1);
  EXPECT_TRUE(std::isfinite(s.groups(0).reward_mean()));
  EXPECT_TRUE(std::isfinite(s.groups(0).reward_std()));
  EXPECT_FLOAT_EQ(s.groups(0).reward_std(), 0.5f);
}

TEST_F(BufferOverGrpc, ARunMismatchIsFailedPreconditionAndAckedLeasesCannotBeNacked) {
  v1::ConfigureRequest c;
  c.set_group_size(1);
  c.set_run_id("run-a");
  ASSERT_TRUE(Configure(c).ok());
  v1::PutExperiencesResponse r;
  grpc::Status s = Put({Exp("a", "", 1)}, &r, "run-b");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "run_id"));
  ASSERT_TRUE(Put({Exp("a", "", 1)}, &r, "run-a").ok());
  auto sampled = SampleAt(1);
  v1::AckBatchResponse acked;
  ASSERT_TRUE(Ack(sampled.lease_id(), &acked).ok());
  v1::NackBatchRequest nack;
  nack.set_lease_id(sampled.lease_id());
  v1::NackBatchResponse nacked;
  EXPECT_EQ(stub_->NackBatch(Context().get(), nack, &nacked).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// Redis runs every command of a MULTI/EXEC even when one fails at exec time (here
// WRONGTYPE: the key the store adds segment numbers to holds a string). The error
// inside EXEC's reply must reach the producer: nothing is acked, nothing is taken; and
// an Ack whose removal Redis refused leaves the lease open.
TEST_F(BufferOverGrpc, AWriteRedisRefusedInsideExecIsNeverAcked) {
  absl::StatusOr<int> redis_port = rlfleet::testing::RedisPortForTest();
  ASSERT_TRUE(redis_port.ok()) << redis_port.status();
  const std::string port = std::to_string(*redis_port);
  const std::string prefix = common::NewId("exec") + ":";
  auto store = OpenBufferStore(absl::StrCat("redis://127.0.0.1:", port, "/", prefix));
  ASSERT_TRUE(store.ok()) << store.status();
  auto redis = redis::Client::Connect("127.0.0.1", *redis_port);
  ASSERT_TRUE(redis.ok());
  Start(store->get());
  ASSERT_TRUE(Configure(1).ok());

  ASSERT_TRUE((*redis)->Command({"SET", prefix + "segs", "not a set"}).ok());
  v1::PutExperiencesResponse r;
  grpc::Status put = Put({Exp("a", "", 1)}, &r);
  EXPECT_EQ(put.error_code(), grpc::StatusCode::UNAVAILABLE) << put.error_message();
  EXPECT_TRUE(absl::StrContains(put.error_message(), "WRONGTYPE")) << put.error_message();
  EXPECT_EQ(r.accepted(), 0u);
  EXPECT_EQ(Stats().accepted_total(), 0u);
  EXPECT_EQ(Stats().depth_experiences(), 0u);

  ASSERT_TRUE((*redis)->Command({"DEL", prefix + "segs"}).ok());
  ASSERT_TRUE(Put({Exp("a", "", 1)}, &r).ok());  // the resend: not a duplicate, nothing was taken
  EXPECT_EQ(r.accepted(), 1u);
  auto sampled = SampleAt(1);
  ASSERT_EQ(sampled.groups_size(), 1);
  ASSERT_TRUE((*redis)->Command({"SET", prefix + "done", "not a set"}).ok());
  v1::AckBatchResponse acked;
  grpc::Status ack = Ack(sampled.lease_id(), &acked);
  EXPECT_EQ(ack.error_code(), grpc::StatusCode::UNAVAILABLE) << ack.error_message();
  EXPECT_EQ(Stats().open_leases(), 1u);
  EXPECT_EQ(Stats().consumed_total(), 0u);
  ASSERT_TRUE((*redis)->Command({"DEL", prefix + "done"}).ok());
  ASSERT_TRUE(Ack(sampled.lease_id(), &acked).ok());
  EXPECT_EQ(acked.consumed_experiences(), 1u);
}

}  // namespace
}  // namespace rlfleet::buffer

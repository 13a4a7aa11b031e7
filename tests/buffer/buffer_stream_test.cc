// StreamExperiences against the real buffer binary: a producer's stream is applied
// message by message with duplicates reported; a bad message ends the stream naming it;
// a full buffer holds the stream (flow control) and then ends it with
// RESOURCE_EXHAUSTED, keeping what it accepted.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <signal.h>

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rlfleet/v1/buffer.grpc.pb.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

using testing::StartService;
using testing::Subprocess;

v1::Experience Exp(const std::string& id, int tokens) {
  v1::Experience e;
  e.mutable_experience_id()->set_value(id);
  e.set_group_id("g-" + id);
  e.set_reward(1.0f);
  for (int i = 0; i < tokens; ++i) e.add_response_token_ids(1000000 + i);
  return e;
}

class BufferStream : public ::testing::Test {
 protected:
  void SetUp() override {
    auto address = StartService(buffer_, "services/buffer/rlfleet-buffer", {"--stream_full_wait=1s"});
    ASSERT_TRUE(address.ok()) << address.status();
    stub_ = v1::BufferService::NewStub(grpc::CreateChannel(*address, grpc::InsecureChannelCredentials()));
    v1::ConfigureRequest config;
    config.set_group_size(1);
    config.set_capacity_bytes(1 << 20);
    grpc::ClientContext context;
    v1::ConfigureResponse configured;
    ASSERT_TRUE(stub_->Configure(&context, config, &configured).ok());
  }
  void TearDown() override {
    if (buffer_.pid() > 0) {
      ASSERT_TRUE(buffer_.Signal(SIGTERM).ok());
      ASSERT_TRUE(buffer_.Wait(absl::Seconds(30)).ok());
    }
  }
  std::unique_ptr<grpc::ClientContext> Context() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return c;
  }
  Subprocess buffer_;
  std::unique_ptr<v1::BufferService::Stub> stub_;
};

TEST_F(BufferStream, MessagesApplyInOrderAndDuplicatesAreReported) {
  auto context = Context();
  v1::PutExperiencesResponse total;
  auto writer = stub_->StreamExperiences(context.get(), &total);
  for (int m = 0; m < 3; ++m) {
    v1::PutExperiencesRequest message;
    for (int i = 0; i < 4; ++i) *message.add_experiences() = Exp(absl::StrCat("e", m * 4 + i), 8);
    ASSERT_TRUE(writer->Write(message));
  }
  v1::PutExperiencesRequest again;  // a resend after a lost acknowledgement
  *again.add_experiences() = Exp("e0", 8);
  *again.add_experiences() = Exp("e5", 8);
  ASSERT_TRUE(writer->Write(again));
  ASSERT_TRUE(writer->WritesDone());
  grpc::Status s = writer->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(total.accepted(), 12u);
  EXPECT_EQ(total.duplicates(), 2u);
  ASSERT_EQ(total.duplicate_ids_size(), 2);
  EXPECT_EQ(total.duplicate_ids(1).value(), "e5");
}

TEST_F(BufferStream, AnEmptyMessageEndsTheStreamNamingIt) {
  auto context = Context();
  v1::PutExperiencesResponse total;
  auto writer = stub_->StreamExperiences(context.get(), &total);
  v1::PutExperiencesRequest ok;
  *ok.add_experiences() = Exp("a", 8);
  ASSERT_TRUE(writer->Write(ok));
  writer->Write(v1::PutExperiencesRequest());
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "message 1 of the stream")) << s.error_message();
}

TEST_F(BufferStream, AFullBufferHoldsTheStreamThenEndsIt) {
  auto context = Context();
  v1::PutExperiencesResponse total;
  auto writer = stub_->StreamExperiences(context.get(), &total);
  // ~45 KB experiences (under capacity / 16), 10 per message: the third message does
  // not fit in 1 MiB and nobody consumes.
  for (int m = 0; m < 6; ++m) {
    v1::PutExperiencesRequest message;
    for (int i = 0; i < 10; ++i) *message.add_experiences() = Exp(absl::StrCat("big", m, "-", i), 15000);
    if (!writer->Write(message)) break;  // the server ended the stream
  }
  writer->WritesDone();
  const absl::Time start = absl::Now();
  grpc::Status s = writer->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "message 2 of the stream")) << s.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  // What was accepted stays.
  grpc::ClientContext stats_context;
  v1::GetStatsResponse stats;
  ASSERT_TRUE(stub_->GetStats(&stats_context, {}, &stats).ok());
  EXPECT_EQ(stats.depth_experiences(), 20u);
}

}  // namespace
}  // namespace rlfleet

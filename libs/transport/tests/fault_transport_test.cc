#include "libs/transport/fault/fault_transport.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/transport/loopback/loopback_transport.h"
#include "libs/transport/tests/conformance.h"
#include "libs/transport/tests/pattern.h"

namespace rlfleet::transport::testing {
namespace {

// With an empty plan the decorator is transparent: the whole suite passes through it.
Backend FaultOverLoopback() {
  Backend b;
  b.name = "fault_over_loopback";
  b.make_local = [] { return std::make_unique<FaultTransport>(LoopbackTransport::Create()); };
  b.make_peer = [] {
    auto transport = LoopbackTransport::Create();
    LoopbackTransport* raw = transport.get();
    return std::make_unique<TransportPeer>(std::move(transport), [raw] { raw->Close(); });
  };
  b.max_size = 16 << 20;
  return b;
}
INSTANTIATE_TEST_SUITE_P(Fault, TransportConformanceTest, ::testing::Values(FaultOverLoopback()), BackendName);

class FaultTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fault_ = std::make_unique<FaultTransport>(LoopbackTransport::Create());
    peer_ = LoopbackTransport::Create();
    to_peer_ = *fault_->Connect(peer_->LocalAddress());
    from_fault_ = *peer_->Connect(fault_->LocalAddress());
    src_.resize(kSize);
    dst_.resize(kSize);
    FillPattern(src_.data(), kSize, 7, 0);
    src_h_ = *fault_->RegisterMemory(src_.data(), kSize, MemoryKind::kHost, 0);
    dst_h_ = *peer_->RegisterMemory(dst_.data(), kSize, MemoryKind::kHost, 0);
  }

  // Sends src_ through the fault transport into dst_ at the peer.
  absl::Status SendOnce(absl::Duration timeout = absl::Seconds(5)) {
    auto recv = peer_->Recv(from_fault_, 1, dst_h_, 0, kSize);
    auto send = fault_->Send(to_peer_, 1, src_h_, 0, kSize);
    absl::Status s = send->Wait(timeout);
    if (!s.ok()) return s;
    return recv->Wait(timeout);
  }

  static constexpr uint64_t kSize = 4096;
  std::unique_ptr<FaultTransport> fault_;
  std::unique_ptr<LoopbackTransport> peer_;
  PeerId to_peer_ = 0, from_fault_ = 0;
  std::vector<uint8_t> src_, dst_;
  MemoryHandle src_h_, dst_h_;
};

TEST_F(FaultTransportTest, DelayHoldsCompletionBack) {
  fault_->SetPlan(FaultPlan{.delay = absl::Milliseconds(300)});
  auto recv = peer_->Recv(from_fault_, 1, dst_h_, 0, kSize);
  auto send = fault_->Send(to_peer_, 1, src_h_, 0, kSize);
  EXPECT_EQ(send->Wait(absl::Milliseconds(50)).code(), absl::StatusCode::kDeadlineExceeded);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(send->Wait(absl::Seconds(5)).ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_TRUE(recv->Wait(absl::Seconds(5)).ok());
  EXPECT_EQ(fault_->counters().delayed, 1u);
}

TEST_F(FaultTransportTest, DroppedTransferNeverArrivesAndWaitTimesOut) {
  fault_->SetPlan(FaultPlan{.drop_probability = 1.0});
  auto recv = peer_->Recv(from_fault_, 1, dst_h_, 0, kSize);
  auto send = fault_->Send(to_peer_, 1, src_h_, 0, kSize);
  EXPECT_EQ(send->Wait(absl::Milliseconds(100)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(recv->Wait(absl::Milliseconds(100)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(fault_->counters().dropped, 1u);
}

TEST_F(FaultTransportTest, CorruptedSendFlipsExactlyOneByteAtTheReceiverOnly) {
  fault_->SetPlan(FaultPlan{.corrupt_probability = 1.0, .seed = 3});
  ASSERT_TRUE(SendOnce().ok());
  int differing = 0;
  for (uint64_t i = 0; i < kSize; ++i) differing += dst_[i] != src_[i];
  EXPECT_EQ(differing, 1);
  EXPECT_TRUE(VerifyPattern(src_.data(), kSize, 7, 0).ok()) << "the sender's buffer changed";
  EXPECT_EQ(fault_->counters().corrupted, 1u);
}

TEST_F(FaultTransportTest, CorruptedRecvAndGetFlipOneReceivedByte) {
  fault_->SetPlan(FaultPlan{.corrupt_probability = 1.0});
  std::vector<uint8_t> in(kSize);
  MemoryHandle in_h = *fault_->RegisterMemory(in.data(), kSize, MemoryKind::kHost, 0);
  auto recv = fault_->Recv(to_peer_, 2, in_h, 0, kSize);
  std::vector<uint8_t> out(kSize);
  FillPattern(out.data(), kSize, 9, 0);
  MemoryHandle out_h = *peer_->RegisterMemory(out.data(), kSize, MemoryKind::kHost, 0);
  ASSERT_TRUE(peer_->Send(from_fault_, 2, out_h, 0, kSize)->Wait(absl::Seconds(5)).ok());
  ASSERT_TRUE(recv->Wait(absl::Seconds(5)).ok());
  EXPECT_FALSE(VerifyPattern(in.data(), kSize, 9, 0).ok());

  auto remote = peer_->Describe(out_h);
  ASSERT_TRUE(remote.ok());
  std::fill(in.begin(), in.end(), 0);
  ASSERT_TRUE(fault_->Get(to_peer_, in_h, 0, *remote, 0, kSize)->Wait(absl::Seconds(5)).ok());
  int differing = 0;
  for (uint64_t i = 0; i < kSize; ++i) differing += in[i] != out[i];
  EXPECT_EQ(differing, 1);
}

TEST_F(FaultTransportTest, FailAfterNFailsEveryLaterTransfer) {
  fault_->SetPlan(FaultPlan{.fail_after = 2});
  EXPECT_TRUE(SendOnce().ok());
  EXPECT_TRUE(SendOnce().ok());
  auto third = fault_->Send(to_peer_, 1, src_h_, 0, kSize);
  absl::Status s = third->Wait(absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "fault injection"));
  EXPECT_EQ(fault_->counters().failed, 1u);
  EXPECT_EQ(fault_->GetCapabilities().backend, "fault(loopback)");
}

}  // namespace
}  // namespace rlfleet::transport::testing

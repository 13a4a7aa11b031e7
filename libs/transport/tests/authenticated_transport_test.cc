// The authenticated decorator: the whole conformance suite passes through it (both
// sides hold the fleet secret), and descriptors that are forged, altered, unsigned,
// signed with another secret or expired are refused before anything moves.
#include "libs/transport/authenticated/authenticated_transport.h"

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "libs/transport/loopback/loopback_transport.h"
#include "libs/transport/tests/conformance.h"

namespace rlfleet::transport::testing {
namespace {

const std::string kSecret = "0123456789abcdef-fleet-secret";

std::unique_ptr<Transport> Authenticated(std::unique_ptr<LoopbackTransport> inner,
                                         const std::string& secret = kSecret) {
  return std::make_unique<AuthenticatedTransport>(std::move(inner), secret);
}

Backend AuthenticatedLoopback() {
  Backend b;
  b.name = "authenticated_loopback";
  b.signs_descriptors = true;
  b.make_local = [] { return Authenticated(LoopbackTransport::Create()); };
  b.make_peer = [] {
    auto inner = LoopbackTransport::Create();
    LoopbackTransport* raw = inner.get();
    return std::make_unique<TransportPeer>(Authenticated(std::move(inner)), [raw] { raw->Close(); });
  };
  return b;
}

INSTANTIATE_TEST_SUITE_P(Authenticated, TransportConformanceTest, ::testing::Values(AuthenticatedLoopback()),
                         BackendName);

class AuthenticatedTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    owner_ = Authenticated(LoopbackTransport::Create());
    user_ = Authenticated(LoopbackTransport::Create());
    owned_.assign(4096, 7);
    auto h = owner_->RegisterMemory(owned_.data(), owned_.size(), MemoryKind::kHost, 0);
    ASSERT_TRUE(h.ok()) << h.status();
    owner_handle_ = *h;
    auto d = owner_->Describe(owner_handle_);
    ASSERT_TRUE(d.ok()) << d.status();
    descriptor_ = *d;
    local_.assign(4096, 0);
    auto l = user_->RegisterMemory(local_.data(), local_.size(), MemoryKind::kHost, 0);
    ASSERT_TRUE(l.ok());
    local_handle_ = *l;
    auto peer = user_->Connect(owner_->LocalAddress());
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_ = *peer;
  }

  absl::Status GetWith(const v1::RemoteMemoryDescriptor& d) {
    return user_->Get(peer_, local_handle_, 0, d, 0, 1024)->Wait(absl::Seconds(10));
  }
  absl::Status PutWith(const v1::RemoteMemoryDescriptor& d) {
    return user_->Put(peer_, local_handle_, 0, d, 0, 1024)->Wait(absl::Seconds(10));
  }

  std::unique_ptr<Transport> owner_, user_;
  std::vector<uint8_t> owned_, local_;
  MemoryHandle owner_handle_, local_handle_;
  v1::RemoteMemoryDescriptor descriptor_;
  PeerId peer_ = 0;
};

TEST_F(AuthenticatedTransportTest, AnIssuedDescriptorWorks) {
  EXPECT_EQ(user_->GetCapabilities().backend, "authenticated(loopback)");
  EXPECT_EQ(BaseBackend(user_->GetCapabilities()), "loopback");
  EXPECT_FALSE(descriptor_.mac().empty());
  ASSERT_TRUE(GetWith(descriptor_).ok());
  EXPECT_EQ(local_[0], 7);
  EXPECT_TRUE(PutWith(descriptor_).ok());
}

TEST_F(AuthenticatedTransportTest, AlteredForgedOrUnsignedDescriptorsMoveNothing) {
  std::vector<v1::RemoteMemoryDescriptor> bad;
  v1::RemoteMemoryDescriptor longer = descriptor_;  // reach past the region
  longer.set_length_bytes(descriptor_.length_bytes() * 1000);
  bad.push_back(longer);
  v1::RemoteMemoryDescriptor moved = descriptor_;  // another address
  moved.set_base_address(descriptor_.base_address() + 64);
  bad.push_back(moved);
  v1::RemoteMemoryDescriptor later = descriptor_;  // extend its life
  later.set_mac_expires_unix_ms(descriptor_.mac_expires_unix_ms() + 1);
  bad.push_back(later);
  v1::RemoteMemoryDescriptor unsigned_one = descriptor_;
  unsigned_one.clear_mac();
  bad.push_back(unsigned_one);
  v1::RemoteMemoryDescriptor other_secret = descriptor_;
  SignDescriptor("another-fleet-secret-0000", absl::Hours(1), &other_secret);
  bad.push_back(other_secret);

  for (const v1::RemoteMemoryDescriptor& d : bad) {
    std::fill(owned_.begin(), owned_.end(), 7);
    std::fill(local_.begin(), local_.end(), 0);
    absl::Status get = GetWith(d);
    EXPECT_EQ(get.code(), absl::StatusCode::kPermissionDenied) << get;
    absl::Status put = PutWith(d);
    EXPECT_EQ(put.code(), absl::StatusCode::kPermissionDenied) << put;
    EXPECT_EQ(user_->MapRemote(peer_, d).status().code(), absl::StatusCode::kPermissionDenied);
    Transport::PutOp op{local_handle_, 0, &d, 0, 16};
    EXPECT_EQ(user_->PutBatch(peer_, {op})->Wait(absl::Seconds(10)).code(), absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(local_[0], 0) << "a refused Get moved bytes";
    EXPECT_EQ(owned_[0], 7) << "a refused Put moved bytes";
  }
}

TEST(DescriptorMac, ExpiredDescriptorsAreRefusedAsReplays) {
  v1::RemoteMemoryDescriptor d;
  d.set_base_address(4096);
  d.set_length_bytes(100);
  const absl::Time issued = absl::FromUnixSeconds(1'800'000'000);
  SignDescriptor(kSecret, absl::Minutes(5), &d, issued);
  EXPECT_TRUE(VerifyDescriptor(kSecret, d, issued + absl::Minutes(4)).ok());
  absl::Status late = VerifyDescriptor(kSecret, d, issued + absl::Minutes(6));
  EXPECT_EQ(late.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(late.message(), "expired")) << late;
  absl::Status forged = VerifyDescriptor("a-different-secret-xx", d, issued);
  EXPECT_TRUE(absl::StrContains(forged.message(), "MAC mismatch")) << forged;
}

}  // namespace
}  // namespace rlfleet::transport::testing

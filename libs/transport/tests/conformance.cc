#include "libs/transport/tests/conformance.h"

#include <algorithm>
#include <cstring>
#include <list>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/transport/tests/pattern.h"

namespace rlfleet::transport::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

std::vector<uint64_t> Sizes(uint64_t max) {
  std::vector<uint64_t> sizes;
  for (uint64_t s : {uint64_t{1}, uint64_t{7}, uint64_t{4096}, uint64_t{65536 + 3}, uint64_t{1} << 20,
                     uint64_t{16} << 20, uint64_t{256} << 20}) {
    if (s <= max) sizes.push_back(s);
  }
  return sizes;
}

}  // namespace

void TransportConformanceTest::SetUp() {
  local_ = GetParam().make_local();
  ASSERT_NE(local_, nullptr);
  peer_ = GetParam().make_peer();
  ASSERT_NE(peer_, nullptr);
  auto address = peer_->Address();
  ASSERT_TRUE(address.ok()) << address.status();
  auto id = local_->Connect(*address);
  ASSERT_TRUE(id.ok()) << id.status();
  peer_id_ = *id;
  absl::Status connected = peer_->ConnectTo(local_->LocalAddress());
  ASSERT_TRUE(connected.ok()) << connected;
}

void TransportConformanceTest::TearDown() {
  peer_.reset();
  local_.reset();
}

MemoryHandle TransportConformanceTest::LocalBuffer(uint64_t size, uint64_t seed, std::vector<uint8_t>* storage) {
  storage->assign(size, 0);
  FillPattern(storage->data(), size, seed, 0);
  auto handle = local_->RegisterMemory(storage->data(), size);
  EXPECT_TRUE(handle.ok()) << handle.status();
  return handle.ok() ? *handle : MemoryHandle{};
}

TEST_P(TransportConformanceTest, CapabilitiesDescribeTheBackend) {
  Capabilities caps = local_->GetCapabilities();
  EXPECT_FALSE(caps.backend.empty());
  EXPECT_TRUE(caps.host_memory);
  EXPECT_TRUE(caps.two_sided);
  EXPECT_GE(caps.max_message_bytes, GetParam().max_size);
}

TEST_P(TransportConformanceTest, SendToPeerIsByteExactForEverySize) {
  for (uint64_t size : Sizes(GetParam().max_size)) {
    SCOPED_TRACE(absl::StrCat("size ", size));
    auto recv = peer_->PostRecv(/*tag=*/size, size);
    ASSERT_TRUE(recv.ok()) << recv.status();
    std::vector<uint8_t> storage;
    MemoryHandle h = LocalBuffer(size, /*seed=*/size + 1, &storage);
    auto send = local_->Send(peer_id_, size, h, 0, size);
    ASSERT_TRUE(send->Wait(kTimeout).ok());
    EXPECT_EQ(send->bytes(), size);
    ASSERT_TRUE(peer_->WaitRecv(*recv, size, size + 1, kTimeout).ok());
    ASSERT_TRUE(local_->DeregisterMemory(h).ok());
  }
}

TEST_P(TransportConformanceTest, RecvFromPeerIsByteExactForEverySize) {
  for (uint64_t size : Sizes(GetParam().max_size)) {
    SCOPED_TRACE(absl::StrCat("size ", size));
    std::vector<uint8_t> storage;
    MemoryHandle h = LocalBuffer(size, /*seed=*/0, &storage);
    std::fill(storage.begin(), storage.end(), 0);
    auto recv = local_->Recv(peer_id_, /*tag=*/7, h, 0, size);
    auto send = peer_->PostSend(7, size, /*seed=*/size * 3);
    ASSERT_TRUE(send.ok()) << send.status();
    absl::Status status = recv->Wait(kTimeout);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(recv->bytes(), size);
    ASSERT_TRUE(VerifyPattern(storage.data(), size, size * 3, 0).ok());
    ASSERT_TRUE(peer_->WaitSend(*send, kTimeout).ok());
    ASSERT_TRUE(local_->DeregisterMemory(h).ok());
  }
}

TEST_P(TransportConformanceTest, PutAndGetAreByteExactForEverySizeAndOffset) {
  if (!local_->GetCapabilities().one_sided) GTEST_SKIP() << "backend has no one-sided ops";
  for (uint64_t size : Sizes(GetParam().max_size)) {
    SCOPED_TRACE(absl::StrCat("size ", size));
    const uint64_t offset = size > 4096 ? 4096 + 5 : 3;  // unaligned remote offset
    auto slot = peer_->Allocate(size + offset, /*seed=*/99);
    ASSERT_TRUE(slot.ok()) << slot.status();
    auto remote = peer_->Describe(*slot);
    ASSERT_TRUE(remote.ok()) << remote.status();

    std::vector<uint8_t> storage;
    MemoryHandle h = LocalBuffer(size, /*seed=*/size + 11, &storage);
    auto put = local_->Put(peer_id_, h, 0, *remote, offset, size);
    absl::Status put_status = put->Wait(kTimeout);
    ASSERT_TRUE(put_status.ok()) << put_status;
    ASSERT_TRUE(peer_->Verify(*slot, offset, size, size + 11, 0).ok());
    ASSERT_TRUE(peer_->Verify(*slot, 0, offset, 99, 0).ok()) << "bytes before the range changed";

    std::fill(storage.begin(), storage.end(), 0);
    auto get = local_->Get(peer_id_, h, 0, *remote, 0, size);
    absl::Status get_status = get->Wait(kTimeout);
    ASSERT_TRUE(get_status.ok()) << get_status;
    // The first `offset` bytes are still pattern 99, the rest what we put.
    ASSERT_TRUE(VerifyPattern(storage.data(), std::min(offset, size), 99, 0).ok());
    if (size > offset) {
      ASSERT_TRUE(VerifyPattern(storage.data() + offset, size - offset, size + 11, 0).ok());
    }
    ASSERT_TRUE(local_->DeregisterMemory(h).ok());
    ASSERT_TRUE(peer_->Deregister(*slot).ok());
  }
}

TEST_P(TransportConformanceTest, TransportAllocatedMemoryWorksOnBothSides) {
  constexpr uint64_t kSize = (4 << 20) + 13;
  auto local = local_->AllocateMemory(kSize);
  ASSERT_TRUE(local.ok()) << local.status();
  auto* bytes = static_cast<uint8_t*>(local->base);
  FillPattern(bytes, kSize, 21, 0);
  auto recv = peer_->PostRecv(3, kSize);
  ASSERT_TRUE(recv.ok());
  ASSERT_TRUE(local_->Send(peer_id_, 3, *local, 0, kSize)->Wait(kTimeout).ok());
  ASSERT_TRUE(peer_->WaitRecv(*recv, kSize, 21, kTimeout).ok());
  if (local_->GetCapabilities().one_sided) {
    auto slot = peer_->Allocate(kSize, 4, /*native=*/true);
    ASSERT_TRUE(slot.ok()) << slot.status();
    auto remote = peer_->Describe(*slot);
    ASSERT_TRUE(remote.ok());
    ASSERT_TRUE(local_->Put(peer_id_, *local, 0, *remote, 0, kSize)->Wait(kTimeout).ok());
    ASSERT_TRUE(peer_->Verify(*slot, 0, kSize, 21, 0).ok());
    ASSERT_TRUE(peer_->Deregister(*slot).ok());
  }
  ASSERT_TRUE(local_->DeregisterMemory(*local).ok());
  EXPECT_EQ(local_->AllocateMemory(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportConformanceTest, PutBatchLandsEveryPutBeforeItCompletes) {
  if (!local_->GetCapabilities().one_sided) GTEST_SKIP() << "backend has no one-sided ops";
  constexpr int kCount = 32;
  for (uint64_t chunk : {uint64_t{7}, uint64_t{65536 + 3}, uint64_t{1} << 20}) {
    SCOPED_TRACE(absl::StrCat("chunk ", chunk));
    auto slot = peer_->Allocate(chunk * kCount, 1);
    ASSERT_TRUE(slot.ok());
    auto remote = peer_->Describe(*slot);
    ASSERT_TRUE(remote.ok());
    std::vector<uint8_t> storage;
    MemoryHandle h = LocalBuffer(chunk * kCount, 8, &storage);
    std::vector<Transport::PutOp> ops;
    for (int i = 0; i < kCount; ++i) {
      ops.push_back({h, i * chunk, &*remote, i * chunk, chunk});
    }
    auto done = local_->PutBatch(peer_id_, ops);
    ASSERT_TRUE(done->Wait(kTimeout).ok());
    EXPECT_EQ(done->bytes(), chunk * kCount);
    ASSERT_TRUE(peer_->Verify(*slot, 0, chunk * kCount, 8, 0).ok());
    // One bad op fails the batch with its error.
    ops.push_back({h, 0, &*remote, chunk * kCount, 1});
    EXPECT_EQ(local_->PutBatch(peer_id_, ops)->Wait(kTimeout).code(), absl::StatusCode::kOutOfRange);
    ASSERT_TRUE(local_->DeregisterMemory(h).ok());
    ASSERT_TRUE(peer_->Deregister(*slot).ok());
  }
}

TEST_P(TransportConformanceTest, ManyConcurrentTransfersAllComplete) {
  constexpr int kCount = 64;
  constexpr uint64_t kSize = 64 << 10;
  std::vector<int> recvs;
  for (int i = 0; i < kCount; ++i) {
    auto r = peer_->PostRecv(1000 + i, kSize);
    ASSERT_TRUE(r.ok()) << r.status();
    recvs.push_back(*r);
  }
  std::vector<std::vector<uint8_t>> storage(kCount);
  std::vector<std::unique_ptr<Completion>> sends;
  for (int i = kCount - 1; i >= 0; --i) {  // reverse order: tags must match, not order
    MemoryHandle h = LocalBuffer(kSize, 5000 + i, &storage[i]);
    sends.push_back(local_->Send(peer_id_, 1000 + i, h, 0, kSize));
  }
  // At the same time, 64 puts into disjoint ranges of one remote region.
  int slot = 0;
  std::vector<uint8_t> big;
  std::vector<std::unique_ptr<Completion>> puts;
  if (local_->GetCapabilities().one_sided) {
    auto s = peer_->Allocate(kSize * kCount, 1);
    ASSERT_TRUE(s.ok()) << s.status();
    slot = *s;
    auto remote = peer_->Describe(slot);
    ASSERT_TRUE(remote.ok());
    MemoryHandle h = LocalBuffer(kSize * kCount, 5, &big);
    for (int i = 0; i < kCount; ++i) {
      puts.push_back(local_->Put(peer_id_, h, i * kSize, *remote, i * kSize, kSize));
    }
  }
  for (auto& s : sends) ASSERT_TRUE(s->Wait(kTimeout).ok());
  for (auto& p : puts) ASSERT_TRUE(p->Wait(kTimeout).ok());
  for (int i = 0; i < kCount; ++i) {
    ASSERT_TRUE(peer_->WaitRecv(recvs[i], kSize, 5000 + i, kTimeout).ok()) << "message " << i;
  }
  if (slot != 0) ASSERT_TRUE(peer_->Verify(slot, 0, kSize * kCount, 5, 0).ok());
}

TEST_P(TransportConformanceTest, MessagesWithOneTagArriveInOrder) {
  constexpr int kCount = 8;
  std::vector<int> recvs;
  for (int i = 0; i < kCount; ++i) recvs.push_back(*peer_->PostRecv(42, 1000 + i));
  std::vector<std::vector<uint8_t>> storage(kCount);
  std::vector<std::unique_ptr<Completion>> sends;
  for (int i = 0; i < kCount; ++i) {
    MemoryHandle h = LocalBuffer(1000 + i, 500 + i, &storage[i]);
    sends.push_back(local_->Send(peer_id_, 42, h, 0, 1000 + i));
  }
  for (auto& s : sends) ASSERT_TRUE(s->Wait(kTimeout).ok());
  for (int i = 0; i < kCount; ++i) {
    EXPECT_TRUE(peer_->WaitRecv(recvs[i], 1000 + i, 500 + i, kTimeout).ok()) << "message " << i;
  }
}

// A withdrawn receive finishes CANCELLED and takes nothing: the next message under its
// tag goes to the receive posted after it.
TEST_P(TransportConformanceTest, ACancelledRecvTakesNoMessage) {
  std::vector<uint8_t> first_storage, second_storage;
  MemoryHandle first = LocalBuffer(4096, 1, &first_storage);
  MemoryHandle second = LocalBuffer(4096, 2, &second_storage);
  std::fill(first_storage.begin(), first_storage.end(), 0);
  std::fill(second_storage.begin(), second_storage.end(), 0);
  auto withdrawn = local_->Recv(peer_id_, /*tag=*/11, first, 0, 4096);
  withdrawn->Cancel();
  EXPECT_EQ(withdrawn->Wait(kTimeout).code(), absl::StatusCode::kCancelled);
  auto recv = local_->Recv(peer_id_, 11, second, 0, 4096);
  auto send = peer_->PostSend(11, 4096, /*seed=*/77);
  ASSERT_TRUE(send.ok()) << send.status();
  ASSERT_TRUE(recv->Wait(kTimeout).ok());
  EXPECT_TRUE(VerifyPattern(second_storage.data(), 4096, 77, 0).ok());
  EXPECT_TRUE(std::all_of(first_storage.begin(), first_storage.end(), [](uint8_t b) { return b == 0; }));
  ASSERT_TRUE(peer_->WaitSend(*send, kTimeout).ok());
  recv->Cancel();  // (finished: no effect)
  EXPECT_TRUE(recv->Wait(absl::ZeroDuration()).ok());
}

TEST_P(TransportConformanceTest, BadInputGetsAClearStatus) {
  std::vector<uint8_t> storage;
  MemoryHandle h = LocalBuffer(4096, 1, &storage);

  // Unknown peer id.
  EXPECT_EQ(local_->Send(peer_id_ + 1000, 1, h, 0, 10)->Wait(kTimeout).code(), absl::StatusCode::kNotFound);
  // Local range outside the registration.
  EXPECT_EQ(local_->Send(peer_id_, 1, h, 4000, 200)->Wait(kTimeout).code(), absl::StatusCode::kOutOfRange);
  // Malformed address.
  EXPECT_EQ(local_->Connect("not an address").status().code(), absl::StatusCode::kInvalidArgument);
  // Registration errors.
  EXPECT_EQ(local_->RegisterMemory(nullptr, 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(local_->RegisterMemory(storage.data(), 0).status().code(), absl::StatusCode::kInvalidArgument);

  if (local_->GetCapabilities().one_sided) {
    auto slot = peer_->Allocate(1024, 3);
    ASSERT_TRUE(slot.ok());
    auto remote = peer_->Describe(*slot);
    ASSERT_TRUE(remote.ok());
    // Remote range outside the remote registration.
    EXPECT_EQ(local_->Put(peer_id_, h, 0, *remote, 1000, 100)->Wait(kTimeout).code(), absl::StatusCode::kOutOfRange);
    // Unknown remote key: a garbled key or a registration id that never existed.
    v1::RemoteMemoryDescriptor garbled = *remote;
    garbled.set_packed_rkey("garbage");
    garbled.set_registration_id(987654);
    absl::Status unknown = local_->Put(peer_id_, h, 0, garbled, 0, 10)->Wait(kTimeout);
    if (GetParam().signs_descriptors) {
      EXPECT_EQ(unknown.code(), absl::StatusCode::kPermissionDenied) << unknown;
    } else {
      EXPECT_TRUE(unknown.code() == absl::StatusCode::kInvalidArgument ||
                  unknown.code() == absl::StatusCode::kFailedPrecondition)
          << unknown;
    }
    // A descriptor of another backend.
    v1::RemoteMemoryDescriptor other = *remote;
    other.set_backend(v1::TRANSFER_BACKEND_NCCL);
    EXPECT_EQ(local_->Put(peer_id_, h, 0, other, 0, 10)->Wait(kTimeout).code(),
              GetParam().signs_descriptors ? absl::StatusCode::kPermissionDenied : absl::StatusCode::kInvalidArgument);
    // Stale remote key: the owner deregistered it.
    ASSERT_TRUE(peer_->Deregister(*slot).ok());
    absl::Status stale = local_->Put(peer_id_, h, 0, *remote, 0, 10)->Wait(kTimeout);
    EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
    EXPECT_TRUE(absl::StrContains(stale.message(), "stale")) << stale;
    EXPECT_EQ(local_->Get(peer_id_, h, 0, *remote, 0, 10)->Wait(kTimeout).code(),
              absl::StatusCode::kFailedPrecondition);
  }

  // Deregistered local memory.
  ASSERT_TRUE(local_->DeregisterMemory(h).ok());
  EXPECT_EQ(local_->Send(peer_id_, 1, h, 0, 10)->Wait(kTimeout).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(local_->DeregisterMemory(h).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(local_->Describe(h).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(TransportConformanceTest, OversizedMessageIsDataLossAtTheReceiver) {
  auto recv = peer_->PostRecv(9, 100);
  ASSERT_TRUE(recv.ok());
  std::vector<uint8_t> storage;
  MemoryHandle h = LocalBuffer(200, 1, &storage);
  auto send = local_->Send(peer_id_, 9, h, 0, 200);
  absl::Status received = peer_->WaitRecv(*recv, 200, 1, kTimeout);
  EXPECT_EQ(received.code(), absl::StatusCode::kDataLoss) << received;
  (void)send->Wait(kTimeout);
}

TEST_P(TransportConformanceTest, PeerKilledMidTransferIsAnErrorWithinTheDeadline) {
  std::vector<uint8_t> storage;
  MemoryHandle h = LocalBuffer(16 << 20, 1, &storage);
  // In flight when the peer dies: a receive it will never satisfy, and a 16 MiB send
  // it never receives (rendezvous: waits for the peer's receive).
  auto recv = local_->Recv(peer_id_, 77, h, 0, 1 << 20);
  auto send = local_->Send(peer_id_, 79, h, 0, 16 << 20);
  peer_->Kill();
  const absl::Duration deadline = GetParam().peer_death_detected ? absl::Seconds(10) : absl::Seconds(2);
  const absl::Time start = absl::Now();
  absl::Status recv_status = recv->Wait(deadline);
  absl::Status send_status = send->Wait(deadline);
  const absl::Duration took = absl::Now() - start;
  if (GetParam().peer_death_detected) {
    EXPECT_TRUE(absl::IsUnavailable(recv_status)) << recv_status;
    EXPECT_TRUE(absl::IsUnavailable(send_status)) << send_status;
  } else {
    EXPECT_FALSE(recv_status.ok());
    EXPECT_FALSE(send_status.ok());
  }
  EXPECT_LT(took, 2 * deadline + absl::Seconds(1));
  // New transfers to the dead peer fail at once, within the deadline too.
  const absl::Time start2 = absl::Now();
  absl::Status later = local_->Send(peer_id_, 78, h, 0, 1 << 20)->Wait(deadline);
  EXPECT_FALSE(later.ok());
  EXPECT_LT(absl::Now() - start2, deadline + absl::Seconds(1));
}

}  // namespace rlfleet::transport::testing

// The conformance suite over UCX: tcp and shared memory, with the peer in this process
// (a second worker) and in another process (transport_peer).
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/transport/tests/conformance.h"
#include "libs/transport/ucx/ucx_transport.h"
#include "tests/util/subprocess.h"

namespace rlfleet::transport::testing {
namespace {

std::unique_ptr<Transport> MakeUcx(const std::string& tls) {
  UcxOptions options;
  options.tls = tls;
  auto transport = UcxTransport::Create(options);
  EXPECT_TRUE(transport.ok()) << transport.status();
  return transport.ok() ? std::move(*transport) : nullptr;
}

Backend InProcess(const std::string& name, const std::string& tls) {
  Backend b;
  b.name = name;
  // Over shared memory a peer in this process cannot be told dead by its pid.
  b.peer_death_detected = tls == "tcp";
  b.make_local = [tls] { return MakeUcx(tls); };
  b.make_peer = [tls]() -> std::unique_ptr<Peer> {
    auto transport = MakeUcx(tls);
    if (transport == nullptr) return nullptr;
    // In process, Kill() destroys the peer's transport (its endpoints close).
    return std::make_unique<TransportPeer>(std::move(transport));
  };
  return b;
}

Backend CrossProcess(const std::string& name, const std::string& tls) {
  Backend b;
  b.name = name;
  b.make_local = [tls] { return MakeUcx(tls); };
  b.make_peer = [tls] {
    return StartProcessPeer(
        {rlfleet::testing::RunfilePath("libs/transport/tests/transport_peer"), "--backend=ucx", "--ucx_tls=" + tls});
  };
  return b;
}

INSTANTIATE_TEST_SUITE_P(Ucx, TransportConformanceTest,
                         ::testing::Values(CrossProcess("tcp_two_processes", "tcp"),
                                           CrossProcess("shm_two_processes", "sm,self"),
                                           CrossProcess("posix_cma_two_processes", "posix,cma,self"),
                                           InProcess("tcp_one_process", "tcp"),
                                           InProcess("posix_cma_one_process", "posix,cma,self")),
                         BackendName);

// MapRemote: a peer's AllocateMemory region over shared memory maps, and stores through
// the mapping are in the owner's memory; memory UCX did not allocate, and tcp, do not.
TEST(UcxMapRemoteTest, SharedMemoryRegionsMapAndOthersAreUnimplemented) {
  auto owner = MakeUcx("posix,cma,self");
  auto mapper = MakeUcx("posix,cma,self");
  ASSERT_NE(owner, nullptr);
  ASSERT_NE(mapper, nullptr);
  EXPECT_TRUE(mapper->GetCapabilities().maps_peer_memory);
  auto peer = mapper->Connect(owner->LocalAddress());
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto region = owner->AllocateMemory(1 << 20, MemoryKind::kHost, 0);
  ASSERT_TRUE(region.ok()) << region.status();
  std::memset(region->base, 0, region->length);
  auto descriptor = owner->Describe(*region);
  ASSERT_TRUE(descriptor.ok());
  {
    auto mapping = mapper->MapRemote(*peer, *descriptor);
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    ASSERT_EQ((*mapping)->length(), region->length);
    std::memset((*mapping)->data() + 4096, 0x5a, 100);
    EXPECT_EQ(static_cast<uint8_t*>(region->base)[4096], 0x5a);
    EXPECT_EQ(static_cast<uint8_t*>(region->base)[4195], 0x5a);
    EXPECT_EQ(static_cast<uint8_t*>(region->base)[4196], 0);
  }
  // Registered, not allocated by UCX: no shared segment to map.
  std::vector<uint8_t> plain(1 << 16);
  auto registered = owner->RegisterMemory(plain.data(), plain.size(), MemoryKind::kHost, 0);
  ASSERT_TRUE(registered.ok());
  auto plain_descriptor = owner->Describe(*registered);
  ASSERT_TRUE(plain_descriptor.ok());
  EXPECT_EQ(mapper->MapRemote(*peer, *plain_descriptor).status().code(), absl::StatusCode::kUnimplemented);
  // A malformed descriptor is INVALID_ARGUMENT, not a crash.
  v1::RemoteMemoryDescriptor bad = *descriptor;
  bad.set_packed_rkey("garbage");
  EXPECT_EQ(mapper->MapRemote(*peer, bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(owner->DeregisterMemory(*registered).ok());
  EXPECT_TRUE(owner->DeregisterMemory(*region).ok());

  auto tcp = MakeUcx("tcp");
  ASSERT_NE(tcp, nullptr);
  EXPECT_FALSE(tcp->GetCapabilities().maps_peer_memory);
  EXPECT_EQ(tcp->MapRemote(1, *descriptor).status().code(), absl::StatusCode::kUnimplemented);
}

// Deregistering memory whose key was described waits for every peer's ack that it
// holds the key no more; a peer that this transport connected to but that never
// connected back used to ignore the revoke (it knew no endpoint to answer on), so every
// such deregister waited out the whole revoke timeout (a relaying replica, serving its
// next version, waited 5 s on the weights service). It now connects back and answers.
TEST(UcxRevokeTest, ADeregisterDoesNotWaitForAPeerThatNeverConnectedBack) {
  for (const std::string tls : {"tcp", "posix,cma,self"}) {
    SCOPED_TRACE(tls);
    UcxOptions options;
    options.tls = tls;
    options.revoke_timeout = absl::Seconds(30);
    auto owner = UcxTransport::Create(options);
    auto other = UcxTransport::Create(options);
    ASSERT_TRUE(owner.ok() && other.ok());
    ASSERT_TRUE((*owner)->Connect((*other)->LocalAddress()).ok());  // (and never the other way)
    std::vector<uint8_t> memory(1 << 16);
    auto region = (*owner)->RegisterMemory(memory.data(), memory.size(), MemoryKind::kHost, 0);
    ASSERT_TRUE(region.ok());
    ASSERT_TRUE((*owner)->Describe(*region).ok());
    const absl::Time start = absl::Now();
    EXPECT_TRUE((*owner)->DeregisterMemory(*region).ok());
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  }
}

// UCX 1.13 unpacks a remote key without its length: a key whose MD map claims more
// parts than its bytes hold was read past its end (found by fuzz/ucx_rkey_fuzzer.cc:
// SEGV in ucp_ep_rkey_unpack_internal). A descriptor carrying one, with a header that
// passes (the real owner and checksum), is refused naming the key, and a real key
// still reads.
TEST(UcxRkeyTest, AKeyWhosePartsOverrunItIsRefusedBeforeUcxUnpacksIt) {
  UcxOptions options;
  options.tls = "tcp";
  auto owner = UcxTransport::Create(options);
  auto reader = UcxTransport::Create(options);
  ASSERT_TRUE(owner.ok() && reader.ok());
  std::vector<uint8_t> memory(4096, 7), landing(4096, 0);
  auto region = (*owner)->RegisterMemory(memory.data(), memory.size(), MemoryKind::kHost, 0);
  auto local = (*reader)->RegisterMemory(landing.data(), landing.size(), MemoryKind::kHost, 0);
  ASSERT_TRUE(region.ok() && local.ok());
  auto segment = (*owner)->Describe(*region);
  ASSERT_TRUE(segment.ok());
  auto peer = (*reader)->Connect((*owner)->LocalAddress());
  ASSERT_TRUE(peer.ok());
  // The fuzzer's input: an MD map of 36 parts in 11 bytes.
  const std::string ucx_bytes("\x00\x00\x00\x10\xff\xff\xff\xff\xff\xff\xff", 11);
  v1::RemoteMemoryDescriptor forged = *segment;
  std::string packed = segment->packed_rkey().substr(0, 12);  // magic and owner
  const uint64_t registration = segment->registration_id() + 1000;
  packed.append(reinterpret_cast<const char*>(&registration), 8);
  uint64_t h = 1469598103934665603ull;  // (FNV-1a, as the header's checksum)
  for (unsigned char c : ucx_bytes) h = (h ^ c) * 1099511628211ull;
  packed.append(reinterpret_cast<const char*>(&h), 8);
  packed += ucx_bytes;
  forged.set_packed_rkey(packed);
  forged.set_registration_id(registration);
  absl::Status refused = (*reader)->Get(*peer, *local, 0, forged, 0, 64)->Wait(absl::Seconds(10));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "malformed")) << refused;
  ASSERT_TRUE((*reader)->Get(*peer, *local, 0, *segment, 0, 64)->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(landing[0], 7);
}

// A receive posted after its message arrived completes inside ucp_tag_recv_nbx (UCX
// calls back from within the call); the op must not then be kept as a pending receive:
// it was, freed, and the transport's shutdown cancelled it (a SIGSEGV in
// ucp_request_cancel when a rollout replica was stopped, then terminated; ASan: a
// heap-use-after-free).
TEST(UcxRecvTest, AReceivePostedAfterItsMessageArrivedCompletesAndShutsDownCleanly) {
  for (const std::string tls : {"tcp", "posix,cma,self"}) {
    SCOPED_TRACE(tls);
    UcxOptions options;
    options.tls = tls;
    auto receiver = UcxTransport::Create(options);
    auto sender = UcxTransport::Create(options);
    ASSERT_TRUE(receiver.ok() && sender.ok());
    auto to_receiver = (*sender)->Connect((*receiver)->LocalAddress());
    auto to_sender = (*receiver)->Connect((*sender)->LocalAddress());
    ASSERT_TRUE(to_receiver.ok() && to_sender.ok());
    std::vector<uint8_t> out(64, 7), in(64, 0);
    auto out_region = (*sender)->RegisterMemory(out.data(), out.size(), MemoryKind::kHost, 0);
    auto in_region = (*receiver)->RegisterMemory(in.data(), in.size(), MemoryKind::kHost, 0);
    ASSERT_TRUE(out_region.ok() && in_region.ok());
    for (uint64_t tag = 1; tag <= 20; ++tag) {
      ASSERT_TRUE((*sender)->Send(*to_receiver, tag, *out_region, 0, out.size())->Wait(absl::Seconds(10)).ok());
    }
    // (the eager messages reach the receiver's unexpected queue as its worker progresses)
    absl::SleepFor(absl::Milliseconds(200));
    for (uint64_t tag = 1; tag <= 20; ++tag) {
      std::fill(in.begin(), in.end(), 0);
      auto received = (*receiver)->Recv(*to_sender, tag, *in_region, 0, in.size());
      ASSERT_TRUE(received->Wait(absl::Seconds(10)).ok()) << "tag " << tag;
      EXPECT_EQ(in[63], 7) << "tag " << tag;
    }
    EXPECT_TRUE((*receiver)->DeregisterMemory(*in_region).ok());
    EXPECT_TRUE((*sender)->DeregisterMemory(*out_region).ok());
    receiver->reset();  // (shuts down: cancels the receives it still has pending)
  }
}

// Disconnect gives up a live peer's connection: a receive waiting on it fails at once,
// naming why, and the next Connect makes a fresh connection that carries messages.
TEST(UcxDisconnectTest, OpsInFlightFailAndTheNextConnectIsFresh) {
  UcxOptions options;
  options.tls = "tcp";
  auto receiver = UcxTransport::Create(options);
  auto sender = UcxTransport::Create(options);
  ASSERT_TRUE(receiver.ok() && sender.ok());
  auto to_receiver = (*sender)->Connect((*receiver)->LocalAddress());
  auto to_sender = (*receiver)->Connect((*sender)->LocalAddress());
  ASSERT_TRUE(to_receiver.ok() && to_sender.ok());
  std::vector<uint8_t> out(64, 9), in(64, 0);
  auto out_region = (*sender)->RegisterMemory(out.data(), out.size(), MemoryKind::kHost, 0);
  auto in_region = (*receiver)->RegisterMemory(in.data(), in.size(), MemoryKind::kHost, 0);
  ASSERT_TRUE(out_region.ok() && in_region.ok());

  auto waiting = (*receiver)->Recv(*to_sender, 5, *in_region, 0, in.size());  // (nothing sends tag 5)
  (*receiver)->Disconnect(*to_sender, absl::UnavailableError("the test gave it up"));
  const absl::Status failed = waiting->Wait(absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(failed)) << failed;
  EXPECT_TRUE(absl::StrContains(failed.message(), "the test gave it up")) << failed;

  auto again = (*receiver)->Connect((*sender)->LocalAddress());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(*again, *to_sender) << "the given-up connection was reused";
  // Messages both ways (which also completes the fresh endpoint's wire-up before the
  // transports shut down: UCX 1.13 asserts when a worker is destroyed mid-wire-up).
  auto received = (*receiver)->Recv(*again, 6, *in_region, 0, in.size());
  ASSERT_TRUE((*sender)->Send(*to_receiver, 6, *out_region, 0, out.size())->Wait(absl::Seconds(10)).ok());
  ASSERT_TRUE(received->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(in[63], 9);
  in[0] = 4;
  auto back = (*sender)->Recv(*to_receiver, 7, *out_region, 0, out.size());
  ASSERT_TRUE((*receiver)->Send(*again, 7, *in_region, 0, in.size())->Wait(absl::Seconds(10)).ok());
  ASSERT_TRUE(back->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(out[0], 4);
  EXPECT_TRUE((*receiver)->DeregisterMemory(*in_region).ok());
  EXPECT_TRUE((*sender)->DeregisterMemory(*out_region).ok());
}

// Whether process `pid` is stopped (its /proc state T), polled until `timeout`.
bool WaitUntilStopped(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    // "pid (comm) S ...": the state follows the last ')'.
    const size_t paren = text.rfind(')');
    if (paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'T') return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

// A peer that is connected but hung (SIGSTOP: a replica past its deadline) lets the
// first revoke time out; later deregisters do not wait for it again (each used to wait
// the whole revoke timeout: every version a trainer or relay retired cost 5 s while a
// stopped replica stayed connected); an ack from it makes it waited for again.
TEST(UcxRevokeTest, AHungPeerIsWaitedForOnceNotOnEveryDeregister) {
  UcxOptions options;
  options.tls = "tcp";
  options.revoke_timeout = absl::Seconds(2);
  auto owner = UcxTransport::Create(options);
  ASSERT_TRUE(owner.ok());
  std::unique_ptr<Peer> peer = StartProcessPeer(
      {rlfleet::testing::RunfilePath("libs/transport/tests/transport_peer"), "--backend=ucx", "--ucx_tls=tcp"});
  ASSERT_NE(peer, nullptr);
  ASSERT_GT(peer->pid(), 0);
  auto address = (*owner)->LocalAddress();
  ASSERT_TRUE(peer->ConnectTo(address).ok());
  auto peer_address = peer->Address();
  ASSERT_TRUE(peer_address.ok());
  ASSERT_TRUE((*owner)->Connect(*peer_address).ok());
  std::vector<std::vector<uint8_t>> memory(4, std::vector<uint8_t>(1 << 16));
  std::vector<MemoryHandle> regions;
  for (auto& m : memory) {
    auto region = (*owner)->RegisterMemory(m.data(), m.size(), MemoryKind::kHost, 0);
    ASSERT_TRUE(region.ok());
    ASSERT_TRUE((*owner)->Describe(*region).ok());
    regions.push_back(*region);
  }
  auto timed_deregister = [&](const MemoryHandle& region) {
    const absl::Time start = absl::Now();
    EXPECT_TRUE((*owner)->DeregisterMemory(region).ok());
    return absl::Now() - start;
  };
  // Responsive: its ack ends the deregister.
  EXPECT_LT(timed_deregister(regions[0]), absl::Seconds(1));
  ASSERT_EQ(kill(peer->pid(), SIGSTOP), 0);
  // (kill returns before the peer has stopped: under TSan it once still answered the
  // next revoke; wait until the kernel says it is stopped)
  ASSERT_TRUE(WaitUntilStopped(peer->pid(), absl::Seconds(10)));
  EXPECT_GE(timed_deregister(regions[1]), absl::Seconds(2));  // waited once
  EXPECT_LT(timed_deregister(regions[2]), absl::Seconds(1));  // not again
  ASSERT_EQ(kill(peer->pid(), SIGCONT), 0);
  // Continued, it answers the revokes it missed; deregisters stay quick.
  EXPECT_LT(timed_deregister(regions[3]), absl::Seconds(1));
}

// With a fleet secret, control messages (hello, revoke, revoke ack) carry a MAC: a peer
// with the secret is served as before (its acks end a deregister at once), one without
// it is dropped and counted, so it cannot forge an ack that frees memory early.
TEST(UcxControlMacTest, ControlMessagesWithoutTheFleetSecretAreDropped) {
  UcxOptions fleet;
  fleet.tls = "tcp";
  fleet.control_secret = "fleet-secret-0123456789";
  fleet.revoke_timeout = absl::Seconds(30);
  UcxOptions stranger_options = fleet;
  stranger_options.control_secret = "another-secret-xxxxxxxx";
  auto owner = UcxTransport::Create(fleet);
  auto member = UcxTransport::Create(fleet);
  auto stranger = UcxTransport::Create(stranger_options);
  ASSERT_TRUE(owner.ok() && member.ok() && stranger.ok());

  ASSERT_TRUE((*stranger)->Connect((*owner)->LocalAddress()).ok());  // its hello is refused
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while ((*owner)->rejected_control_messages() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));  // awaiting the progress thread, with a deadline
  }
  EXPECT_GE((*owner)->rejected_control_messages(), 1u);

  // A member with the secret: the owner connects to it, describes a region, and its
  // deregister ends on the member's authenticated ack, far before revoke_timeout.
  auto peer = (*member)->Connect((*owner)->LocalAddress());
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::vector<uint8_t> memory(1 << 16, 9), local(1 << 16, 0);
  auto region = (*owner)->RegisterMemory(memory.data(), memory.size(), MemoryKind::kHost, 0);
  auto mine = (*member)->RegisterMemory(local.data(), local.size(), MemoryKind::kHost, 0);
  ASSERT_TRUE(region.ok() && mine.ok());
  auto described = (*owner)->Describe(*region);
  ASSERT_TRUE(described.ok());
  ASSERT_TRUE((*member)->Get(*peer, *mine, 0, *described, 0, 4096)->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(local[0], 9);
  const absl::Time start = absl::Now();
  EXPECT_TRUE((*owner)->DeregisterMemory(*region).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "the member's ack was not accepted";
  EXPECT_EQ((*member)->rejected_control_messages(), 0u);
}

}  // namespace
}  // namespace rlfleet::transport::testing

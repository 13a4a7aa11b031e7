// libFuzzer harness: remote keys from the network, as the UCX data plane unpacks them
// (UcxTransport Get -> Impl::RemoteKey: our header's magic, owner, registration and
// checksum, then ucp_ep_rkey_unpack of the bytes after it), between two UCX transports
// in this process over tcp (the path between hosts).
//
// The first input byte picks how the rest is used: odd, as a whole packed key (our
// header is checked first; almost everything stops there); even, as UCX's own packed
// bytes behind a header that passes (the real owner, a fresh registration id each run,
// so the key is never served from the cache, and the checksum recomputed), so that
// UCX's unpacking sees the fuzzed bytes. Every Get must end in a status within its
// deadline. What is read is the owner's own registered region (the descriptor's
// address and length are real), so a key UCX accepts reads nothing else.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "libs/transport/ucx/ucx_impl.h"
#include "libs/transport/ucx/ucx_transport.h"
#include "rlfleet/v1/common.pb.h"

namespace {

using rlfleet::transport::MemoryHandle;
using rlfleet::transport::MemoryKind;
using rlfleet::transport::PeerId;
using rlfleet::transport::UcxOptions;
using rlfleet::transport::UcxTransport;

constexpr uint64_t kRegion = 4096;

struct World {
  std::unique_ptr<UcxTransport> owner, reader;
  std::string region, landing;
  MemoryHandle landing_handle;
  PeerId peer = 0;
  rlfleet::v1::RemoteMemoryDescriptor segment;
  uint64_t next_registration = uint64_t{1} << 40;
};

World* Make() {
  auto* w = new World();
  UcxOptions options;
  options.tls = "tcp";
  auto owner = UcxTransport::Create(options);
  auto reader = UcxTransport::Create(options);
  if (!owner.ok() || !reader.ok()) std::abort();
  w->owner = std::move(*owner);
  w->reader = std::move(*reader);
  w->region.assign(kRegion, 'r');
  w->landing.assign(kRegion, '\0');
  auto handle = w->owner->RegisterMemory(w->region.data(), kRegion, MemoryKind::kHost, 0);
  auto landing = w->reader->RegisterMemory(w->landing.data(), kRegion, MemoryKind::kHost, 0);
  if (!handle.ok() || !landing.ok()) std::abort();
  w->landing_handle = *landing;
  w->segment = *w->owner->Describe(*handle);
  auto peer = w->reader->Connect(w->owner->LocalAddress());
  if (!peer.ok()) std::abort();
  w->peer = *peer;
  // One real Get first, so that UCX has made its endpoints on both sides (the owner's
  // when the reader first reaches it) before any input runs: they live in UCX's tables,
  // which LeakSanitizer cannot follow, and would read as an input's leak.
  if (!w->reader->Get(w->peer, w->landing_handle, 0, w->segment, 0, 64)->Wait(absl::Seconds(10)).ok()) {
    std::abort();
  }
  // (RLFLEET_FUZZ_SEED=FILE: write the real key as an input of the second kind, the
  // seed fuzz/corpus/ucx_rkey/real_tcp_key was made this way)
  if (const char* seed = std::getenv("RLFLEET_FUZZ_SEED")) {
    std::ofstream(seed, std::ios::binary) << '\0' << w->segment.packed_rkey().substr(rlfleet::transport::kRkeyHeader);
  }
  return w;
}

World* world = nullptr;

// The transports are closed at exit (their endpoints live in UCX's tables, which LSan
// cannot follow: left open they read as leaked).
void Close() {
  delete world;
  world = nullptr;
}

}  // namespace

// (made before the first input: libFuzzer's per-input leak check would otherwise count
// UCX's endpoints, made on the first input, as that input's leak)
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  world = Make();
  std::atexit(Close);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World* w = world;
  if (size == 0) return 0;
  const bool whole = (data[0] & 1) != 0;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  rlfleet::v1::RemoteMemoryDescriptor d = w->segment;
  if (whole) {
    d.set_packed_rkey(rest);
  } else {
    // Our header, passing: the owner's instance (from its real key), a registration id
    // never used before, the checksum of the fuzzed UCX bytes.
    const std::string& real = w->segment.packed_rkey();
    const uint64_t registration = w->next_registration++;
    std::string packed(rlfleet::transport::kRkeyMagic, 4);
    packed.append(real, 4, 8);
    rlfleet::transport::AppendU64(&packed, registration);
    rlfleet::transport::AppendU64(&packed, rlfleet::transport::Hash64(rest.data(), rest.size()));
    packed += rest;
    d.set_packed_rkey(packed);
    d.set_registration_id(registration);
  }
  auto done = w->reader->Get(w->peer, w->landing_handle, 0, d, 0, 64);
  (void)done->Wait(absl::Seconds(5));
  return 0;
}

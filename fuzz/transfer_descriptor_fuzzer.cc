// libFuzzer harness: transfer descriptors from the network, as a service unpacks and
// fetches them (libs/transport DescriptorFetcher: FILE descriptors confined to a root,
// memory descriptors checked against the segment and fetched over a loopback data
// plane) and as the authenticated data plane checks their MAC (VerifyDescriptor, and a
// fetch through an AuthenticatedTransport). The first input byte can graft a real
// registration's segment (plain or signed) onto the fuzzed descriptor, so offsets,
// lengths and digests are explored against memory that exists. Every fetch must end in
// bytes or a status, within its deadline.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "libs/transport/authenticated/authenticated_transport.h"
#include "libs/transport/descriptor_fetcher.h"
#include "libs/transport/loopback/loopback_transport.h"
#include "rlfleet/v1/common.pb.h"

namespace {

using rlfleet::transport::AuthenticatedTransport;
using rlfleet::transport::DescriptorFetcher;
using rlfleet::transport::LoopbackTransport;

const std::string kSecret = "fuzz-secret-0123456789abcdef";
constexpr uint64_t kRegion = 1 << 16;

struct World {
  std::unique_ptr<rlfleet::transport::Transport> owner;   // holds the region
  std::unique_ptr<rlfleet::transport::Transport> signer;  // the same, signing
  std::unique_ptr<rlfleet::transport::Transport> plain;   // fetches without MACs
  std::unique_ptr<rlfleet::transport::Transport> authed;  // fetches with MACs
  std::unique_ptr<DescriptorFetcher> plain_fetcher, authed_fetcher;
  rlfleet::v1::RemoteMemoryDescriptor segment, signed_segment;
  std::string region;
};

World* Make() {
  auto* w = new World();
  w->region.assign(kRegion, '\0');
  for (uint64_t i = 0; i < kRegion; ++i) w->region[i] = static_cast<char>(i * 131);
  w->owner = LoopbackTransport::Create();
  auto handle = w->owner->RegisterMemory(w->region.data(), kRegion, rlfleet::transport::MemoryKind::kHost, 0);
  if (!handle.ok()) std::abort();
  w->segment = *w->owner->Describe(*handle);
  w->signer = std::make_unique<AuthenticatedTransport>(LoopbackTransport::Create(), kSecret);
  auto signed_handle = w->signer->RegisterMemory(w->region.data(), kRegion, rlfleet::transport::MemoryKind::kHost, 0);
  if (!signed_handle.ok()) std::abort();
  w->signed_segment = *w->signer->Describe(*signed_handle);
  w->plain = LoopbackTransport::Create();
  w->authed = std::make_unique<AuthenticatedTransport>(LoopbackTransport::Create(), kSecret);
  const std::string root = std::string(getenv("TMPDIR") != nullptr ? getenv("TMPDIR") : "/tmp");
  std::ofstream(root + "/rlfleet_fuzz_payload", std::ios::binary) << w->region.substr(0, 4096);
  DescriptorFetcher::Options options;
  options.max_bytes = 1 << 20;
  options.timeout = absl::Milliseconds(200);
  options.file_root = root;
  options.max_pending_bytes = 8 << 20;
  w->plain_fetcher = std::make_unique<DescriptorFetcher>(w->plain.get(), options);
  w->authed_fetcher = std::make_unique<DescriptorFetcher>(w->authed.get(), options);
  return w;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* world = Make();
  if (size == 0) return 0;
  rlfleet::v1::TransferDescriptor d;
  if (!d.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  const uint8_t graft = data[0];
  if (graft % 4 == 1) *d.mutable_segment() = world->segment;
  if (graft % 4 == 2) *d.mutable_segment() = world->signed_segment;
  if (graft % 4 == 3 && d.segment().backend() == rlfleet::v1::TRANSFER_BACKEND_FILE) {
    d.mutable_segment()->set_worker_address("rlfleet_fuzz_payload");  // relative to the root
  }
  (void)rlfleet::transport::VerifyDescriptor(kSecret, d.segment());
  for (DescriptorFetcher* fetcher : {world->plain_fetcher.get(), world->authed_fetcher.get()}) {
    absl::StatusOr<std::string> bytes = fetcher->Fetch(d);
    if (bytes.ok() && bytes->size() != d.length_bytes()) std::abort();
  }
  return 0;
}

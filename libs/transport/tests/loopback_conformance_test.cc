#include "libs/transport/loopback/loopback_transport.h"
#include "libs/transport/tests/conformance.h"

namespace rlfleet::transport::testing {
namespace {

Backend LoopbackBackend() {
  Backend b;
  b.name = "loopback";
  // Both sides share the process-wide fabric; each test gets fresh transports.
  b.make_local = [] { return LoopbackTransport::Create(); };
  b.make_peer = [] {
    auto transport = LoopbackTransport::Create();
    LoopbackTransport* raw = transport.get();
    return std::make_unique<TransportPeer>(std::move(transport), [raw] { raw->Close(); });
  };
  return b;
}

INSTANTIATE_TEST_SUITE_P(Loopback, TransportConformanceTest, ::testing::Values(LoopbackBackend()), BackendName);

}  // namespace
}  // namespace rlfleet::transport::testing

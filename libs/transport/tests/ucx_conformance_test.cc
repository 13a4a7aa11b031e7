// The conformance suite over UCX: tcp and shared memory, with the peer in this process
// (a second worker) and in another process (transport_peer).
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
    return StartProcessPeer({rlfleet::testing::RunfilePath("libs/transport/tests/transport_peer"),
                             "--backend=ucx", "--ucx_tls=" + tls});
  };
  return b;
}

INSTANTIATE_TEST_SUITE_P(
    Ucx, TransportConformanceTest,
    ::testing::Values(CrossProcess("tcp_two_processes", "tcp"),
                      CrossProcess("shm_two_processes", "sm,self"),
                      CrossProcess("posix_cma_two_processes", "posix,cma,self"),
                      InProcess("tcp_one_process", "tcp"),
                      InProcess("posix_cma_one_process", "posix,cma,self")),
    BackendName);

}  // namespace
}  // namespace rlfleet::transport::testing

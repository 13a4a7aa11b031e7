// transport_peer: the far side of the transport conformance suite in another process.
// Reads commands on stdin and answers on stdout (see peer.cc).
//   transport_peer --backend=ucx --ucx_tls=tcp
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "libs/transport/tests/peer.h"
#include "libs/transport/ucx/ucx_transport.h"

ABSL_FLAG(std::string, backend, "ucx", "Transport backend: ucx.");
ABSL_FLAG(std::string, ucx_tls, "", "UCX_TLS for the ucx backend (empty: UCX's default).");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_backend) != "ucx") {
    std::cerr << "transport_peer: unknown --backend " << absl::GetFlag(FLAGS_backend) << "\n";
    return 2;
  }
  rlfleet::transport::UcxOptions options;
  options.tls = absl::GetFlag(FLAGS_ucx_tls);
  auto transport = rlfleet::transport::UcxTransport::Create(options);
  if (!transport.ok()) {
    std::cerr << "transport_peer: " << transport.status() << "\n";
    return 1;
  }
  rlfleet::transport::testing::TransportPeer peer(std::move(*transport));
  return rlfleet::transport::testing::RunPeerCommandLoop(peer);
}

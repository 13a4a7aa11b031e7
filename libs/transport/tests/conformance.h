// One conformance suite for every Transport backend (Ray's store_client_test_base,
// c10d's StoreTestCommon). A backend's test file instantiates it:
//
//   INSTANTIATE_TEST_SUITE_P(Loopback, TransportConformanceTest,
//                            ::testing::Values(LoopbackBackend()), BackendName);
//
// The test drives its own Transport (`local`) and a Peer that may live in another
// process. Content is verified byte for byte on the side that received it.
#ifndef RLFLEET_LIBS_TRANSPORT_TESTS_CONFORMANCE_H_
#define RLFLEET_LIBS_TRANSPORT_TESTS_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "libs/transport/tests/peer.h"
#include "libs/transport/transport.h"

namespace rlfleet::transport::testing {

struct Backend {
  std::string name;
  std::function<std::unique_ptr<Transport>()> make_local;
  std::function<std::unique_ptr<Peer>()> make_peer;
  // Largest transfer the suite moves (256 MiB by default).
  uint64_t max_size = 256ull << 20;
  // Whether a dead peer is recognised (UNAVAILABLE) rather than only timed out
  // (DEADLINE_EXCEEDED, still within the deadline). False only for peers in the same
  // process over shared memory, which cannot be told dead by pid.
  bool peer_death_detected = true;
  // Descriptors carry a MAC (AuthenticatedTransport): an altered one is refused with
  // PERMISSION_DENIED before the backend's own checks see it.
  bool signs_descriptors = false;
};

inline void PrintTo(const Backend& backend, std::ostream* os) { *os << backend.name; }

class TransportConformanceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Registers a local buffer of `size` bytes filled with pattern `seed`.
  MemoryHandle LocalBuffer(uint64_t size, uint64_t seed, std::vector<uint8_t>* storage);

  std::unique_ptr<Transport> local_;
  std::unique_ptr<Peer> peer_;
  PeerId peer_id_ = 0;
};

inline std::string BackendName(const ::testing::TestParamInfo<Backend>& info) { return info.param.name; }

}  // namespace rlfleet::transport::testing

#endif  // RLFLEET_LIBS_TRANSPORT_TESTS_CONFORMANCE_H_

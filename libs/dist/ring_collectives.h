// All-reduce over libs/transport, flat (one ring over every rank) or hierarchical (a
// reduce-scatter inside each node over its fast links, an all-reduce of each slice
// across nodes, an all-gather inside each node: topology.h), with an optional 16-bit wire
// format (bf16 / fp16) that halves the bytes on the links it applies to. One call per
// rank, every rank calling with the same arguments; a rank's thread blocks until its
// part is done. Every wait has a deadline: a dead or silent peer is an error naming it
// (DEADLINE_EXCEEDED, or the transport's UNAVAILABLE), never a hang; after an error
// the caller's data is unchanged and the call's buffers stay allocated (a late peer may
// still write into them), so a group that failed should not be used again.
#ifndef RLFLEET_LIBS_DIST_RING_COLLECTIVES_H_
#define RLFLEET_LIBS_DIST_RING_COLLECTIVES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "libs/dist/topology.h"
#include "libs/transport/transport.h"

namespace rlfleet::dist {

enum class WirePrecision { kFp32, kBf16, kFp16 };
const char* WirePrecisionName(WirePrecision p);

// The buffers a rank's collectives reuse: the working copy, the receive buffer and the
// 16-bit staging buffers, registered with the rank's transports. A call takes them when
// they hold its data and gives them back when it succeeds, so that a training step's
// all-reduce neither faults in fresh memory nor registers it again (on an EPYC VM that
// pays ~10 us per fresh page, fresh buffers were most of a 16 MiB 8-rank all-reduce's
// 840 ms: bench/hierarchical_allreduce). A failed call's buffers are not given back (a
// late peer may still write into them). Concurrent calls each get their own: the one
// kept is the largest. Thread-safe.
class CollectiveBuffers {
 public:
  CollectiveBuffers();
  ~CollectiveBuffers();
  CollectiveBuffers(const CollectiveBuffers&) = delete;
  CollectiveBuffers& operator=(const CollectiveBuffers&) = delete;

  struct Set;  // (ring_collectives.cc)
  // A set for `elements` floats registered with `links`' transports: the kept one when
  // it fits (the same transports, enough room), else null.
  std::unique_ptr<Set> Take(size_t elements, const std::vector<transport::Transport*>& transports);
  // Keeps `set` for a later call (the larger of it and the one kept).
  void Give(std::unique_ptr<Set> set);
  // How many elements the kept set holds (0: none kept).
  size_t kept_elements();

 private:
  absl::Mutex mu_;
  std::unique_ptr<Set> kept_ ABSL_GUARDED_BY(mu_);
};

// How this rank reaches every other rank: the transport to use and that rank's PeerId
// on it (a rank may reach same-node peers and other nodes' ranks over different
// transports). Indexed by rank; this rank's own entry is unused.
struct Links {
  int rank = 0;
  std::vector<transport::Transport*> transport;
  std::vector<transport::PeerId> peer;
  // Buffers kept between this rank's calls (see CollectiveBuffers); null: every call
  // allocates and registers its own.
  std::shared_ptr<CollectiveBuffers> buffers = std::make_shared<CollectiveBuffers>();
};

struct CollectiveOptions {
  // Flat: every link. Hierarchical: the inter-node links only (inside a node partial
  // sums travel in fp32). Every rank ends with the same bits either way. fp16 holds
  // magnitudes up to 65504: a larger partial sum becomes inf (no loss scaling here).
  WirePrecision precision = WirePrecision::kFp32;
  absl::Duration timeout = absl::Seconds(30);  // per transfer
  uint64_t tag = 1;                            // distinguishes concurrent collectives between the same ranks
};

// Sum of `data` over the ranks of `ring` (this rank among them), in ring order:
// reduce-scatter, then all-gather, 2 (k - 1) steps of n / k elements.
absl::Status RingAllReduce(absl::Span<float> data, const std::vector<int>& ring, const Links& links,
                           const CollectiveOptions& options);

// Sum of `data` over every rank of `topology` (every node with the same number of ranks,
// else INVALID_ARGUMENT) in three phases: a ring reduce-scatter inside each node leaves
// the rank at position i with its node's sum of slice i; the ranks at position i of
// every node (topology.rails[i]) all-reduce that slice across nodes; a ring all-gather
// inside each node completes every rank. Inter-node traffic is 2 (nodes - 1) / nodes
// of the data in total per node, spread over all its ranks (and their NICs); a flat
// ring over R ranks makes 2 (R - 1) latency-bound steps, this 2 (nodes - 1).
absl::Status HierarchicalAllReduce(absl::Span<float> data, const Topology& topology, const Links& links,
                                   const CollectiveOptions& options);

// The 16-bit wire formats (round to nearest even), exposed for tests.
uint16_t ToBf16(float f);
float FromBf16(uint16_t h);
uint16_t ToFp16(float f);
float FromFp16(uint16_t h);

}  // namespace rlfleet::dist

#endif  // RLFLEET_LIBS_DIST_RING_COLLECTIVES_H_

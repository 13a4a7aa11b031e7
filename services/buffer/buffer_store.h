// Where the buffer keeps what it accepted, so that a restarted buffer loses nothing:
// BufferCore writes every accepted experience here before it answers the Put, and
// removes experiences when they are consumed (acked) or dropped by policy. Open
// leases are not stored: after a restart, leased-but-unacked experiences are back in
// the buffer (a trainer's ack of an old lease is NOT_FOUND and it samples again).
//
// Backends by connection string (OpenBufferStore): `memory://` (none: state lives and
// dies with the process) and `redis://host:port[/prefix]`.
#ifndef RLFLEET_SERVICES_BUFFER_BUFFER_STORE_H_
#define RLFLEET_SERVICES_BUFFER_BUFFER_STORE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rlfleet/v1/common.pb.h"

namespace rlfleet::buffer {

struct BufferSnapshot {
  std::vector<v1::Experience> experiences;  // accepted and not yet consumed or dropped
  std::vector<std::string> seen_ids;        // every id ever accepted
  std::map<std::string, uint64_t> counters; // accepted_total, consumed_total, dropped_*
};

// Thread-safe in every implementation.
class BufferStore {
 public:
  virtual ~BufferStore() = default;
  // Records accepted experiences atomically (all or none). UNAVAILABLE if the store
  // cannot be reached: the caller must then not accept them.
  virtual absl::Status Added(const std::vector<const v1::Experience*>& experiences) = 0;
  // Forgets experiences and adds `count` (their number) to counter `counter`
  // ("consumed_total", "dropped_stale", "dropped_zero_variance").
  virtual absl::Status Removed(const std::vector<std::string>& ids, const std::string& counter) = 0;
  // Adds to a counter without removing anything (e.g. "dropped_duplicate").
  virtual absl::Status Count(const std::string& counter, uint64_t n) = 0;
  virtual absl::StatusOr<BufferSnapshot> Load() = 0;
};

// nullptr for memory://. INVALID_ARGUMENT for an unknown scheme or malformed address;
// UNAVAILABLE if Redis cannot be reached.
absl::StatusOr<std::unique_ptr<BufferStore>> OpenBufferStore(absl::string_view connection);

}  // namespace rlfleet::buffer

#endif  // RLFLEET_SERVICES_BUFFER_BUFFER_STORE_H_

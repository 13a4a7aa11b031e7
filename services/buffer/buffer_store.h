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

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rlfleet/v1/buffer.pb.h"

namespace rlfleet::buffer {

// An experience to record: its serialized v1::Experience (valid for the call).
struct ExperienceBytes {
  absl::string_view bytes;
  uint64_t newest_version = 0;  // max(token_policy_versions): the store keeps the highest seen
};

// An experience as the store holds it: the segment it was written in (what Removed
// needs to find it again) and its serialized v1::Experience.
struct StoredExperience {
  uint64_t segment = 0;
  std::string bytes;
};

// One experience to forget: its segment (from Added or Load) and its id.
struct StoredRef {
  uint64_t segment = 0;
  absl::string_view id;  // valid for the call
};

struct BufferSnapshot {
  std::optional<v1::ConfigureRequest> config;  // the last configuration saved, if any
  uint64_t policy_version = 0;                 // the highest policy version recorded
  std::vector<StoredExperience> experiences;   // accepted and not yet consumed or dropped
  std::vector<std::string> seen_ids;           // every id ever accepted
  std::map<std::string, uint64_t> counters;    // accepted_total, consumed_total, dropped_*
  // Records that did not read and were left out, each naming its key ("`p:seg:7`
  // record 3 is not a serialized Experience").
  std::vector<std::string> skipped;
};

// Thread-safe in every implementation.
class BufferStore {
 public:
  virtual ~BufferStore() = default;
  // Records accepted experiences atomically (all or none) and returns the segment they
  // went into (one number for the whole call). UNAVAILABLE if the store cannot be
  // reached: the caller must then not accept them.
  virtual absl::StatusOr<uint64_t> Added(const std::vector<ExperienceBytes>& experiences) = 0;
  // Added without waiting: `done` runs once with its result, on this thread or the
  // store's (it must not block); the bytes are copied before this returns. This default
  // answers inline with Added.
  virtual void AddedAsync(const std::vector<ExperienceBytes>& experiences,
                          std::function<void(absl::StatusOr<uint64_t>)> done) {
    done(Added(experiences));
  }
  // Forgets experiences, recording why: `counter` is "consumed_total", "dropped_stale"
  // or "dropped_zero_variance" (INVALID_ARGUMENT otherwise); Load counts them there.
  // All or none. Forgetting an experience again (a retry after an error whose write
  // did land) changes nothing.
  virtual absl::Status Removed(const std::vector<StoredRef>& refs, const std::string& counter) = 0;
  // Records the buffer's configuration (group size, staleness bound, ...), so that a
  // restarted buffer groups what it recovers the same way. UNAVAILABLE as for Added.
  virtual absl::Status SaveConfig(const v1::ConfigureRequest& config) = 0;
  // Records that the trainer's policy is at `version` (the store keeps the highest),
  // which the staleness bound is measured against after a restart.
  virtual absl::Status SavePolicyVersion(uint64_t version) = 0;
  // Adds to a counter without removing anything (e.g. "dropped_duplicate").
  virtual absl::Status Count(const std::string& counter, uint64_t n) = 0;
  // What the store holds (the bytes as they were added; removed ones left out). A
  // record that does not read (a garbled segment, gone log, segment number, counter,
  // configuration or version) is left out and named in `skipped`, never an error:
  // errors are only the store's (UNAVAILABLE) or a layout it does not know.
  virtual absl::StatusOr<BufferSnapshot> Load() = 0;
};

// nullptr for memory://. INVALID_ARGUMENT for an unknown scheme or malformed address;
// UNAVAILABLE if Redis cannot be reached. The Redis store keeps the removal logs of
// the newest `keep_retired` retired segments (one segment per group commit: what a
// restarted buffer still refuses as duplicates) and folds older ones into its counters,
// so that what it holds stays bounded on a long run.
absl::StatusOr<std::unique_ptr<BufferStore>> OpenBufferStore(absl::string_view connection, size_t keep_retired = 1024);

}  // namespace rlfleet::buffer

#endif  // RLFLEET_SERVICES_BUFFER_BUFFER_STORE_H_

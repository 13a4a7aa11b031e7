// Where the controller keeps its run, so that a restarted controller resumes it from
// its last step (RunManager::Recover): the run's id, config and state, and the loop's
// progress as of its last step (LoopProgress: step, the tag in its ids, the newest
// version its replicas installed, counts so far). RunManager saves the record when a
// run starts, after every step and when it ends.
//
// Backends (OpenRunStore): none (empty connection: a restarted controller forgets its
// run, as before), `memory://` (tests) and `redis://host:port[/prefix]` (one hash,
// `<prefix>controller:run`, written whole by one HSET: a reader never sees half a
// record; the desired counts in `<prefix>controller:desired`). Thread-safe.
#ifndef RLFLEET_SERVICES_CONTROLLER_RUN_STORE_H_
#define RLFLEET_SERVICES_CONTROLLER_RUN_STORE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "rlfleet/v1/controller.pb.h"
#include "services/controller/controller_core.h"
#include "services/controller/run_loop.h"

namespace rlfleet::controller {

struct RunRecord {
  std::string run_id;
  v1::RunConfig config;
  v1::RunState state = v1::RUN_STATE_IDLE;
  int64_t started_unix_ms = 0;
  std::string run_dir;
  std::string error;
  bool stop_requested = false;
  float last_exact = 0;
  int resumes = 0;        // times a restarted controller resumed it
  LoopProgress progress;  // (held_out_exact and the per-step timings are not kept)
};

// The record as fields of a hash, and back. DATA_LOSS naming the field for a value
// that does not read (a record written by something else, or damaged).
std::map<std::string, std::string> RunRecordFields(const RunRecord& record);
absl::StatusOr<RunRecord> RunRecordFromFields(const std::map<std::string, std::string>& fields);

// Also keeps the desired replica counts (Scale): a restarted controller reports the
// counts it was given, and the launcher or autoscaler goes on acting on them.
class RunStore : public DesiredCountStore {
 public:
  ~RunStore() override = default;
  // Replaces the record. UNAVAILABLE (or DEADLINE_EXCEEDED) when the store cannot be
  // reached: the run goes on and saves again after its next step.
  virtual absl::Status Save(const RunRecord& record) = 0;
  // The record saved last; nullopt when there is none. DATA_LOSS for one that does not
  // read; UNAVAILABLE as for Save.
  virtual absl::StatusOr<std::optional<RunRecord>> Load() = 0;
};

// The desired counts as fields of a hash (role name -> count), and back. DATA_LOSS
// naming the field for an unknown role or a count that is not 0..1024.
std::map<std::string, std::string> DesiredFields(const std::map<int, uint32_t>& desired);
absl::StatusOr<std::map<int, uint32_t>> DesiredFromFields(const std::map<std::string, std::string>& fields);

class InMemoryRunStore : public RunStore {
 public:
  absl::Status Save(const RunRecord& record) override;
  absl::StatusOr<std::optional<RunRecord>> Load() override;
  absl::Status SaveDesired(const std::map<int, uint32_t>& desired) override;
  absl::StatusOr<std::map<int, uint32_t>> LoadDesired() override;

 private:
  absl::Mutex mu_;
  std::optional<std::map<std::string, std::string>> fields_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> desired_ ABSL_GUARDED_BY(mu_);
};

// nullptr for an empty connection (no store). INVALID_ARGUMENT for another scheme or a
// malformed address; UNAVAILABLE if Redis cannot be reached.
absl::StatusOr<std::unique_ptr<RunStore>> OpenRunStore(absl::string_view connection);

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_RUN_STORE_H_

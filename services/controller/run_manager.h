// The controller's run: at most one at a time, RunLoop (run_loop.h) on a thread of its
// own over peers that a factory makes (gRPC adapters in the service, fakes in tests).
// StartRun / StopRun / GetStatus of ControllerService are these calls. Thread-safe;
// free of gRPC.
#ifndef RLFLEET_SERVICES_CONTROLLER_RUN_MANAGER_H_
#define RLFLEET_SERVICES_CONTROLLER_RUN_MANAGER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rlfleet/v1/controller.pb.h"
#include "services/controller/run_loop.h"
#include "services/controller/run_store.h"

namespace rlfleet::controller {

struct RunPeers {
  std::vector<std::unique_ptr<RolloutReplica>> rollouts;
  std::unique_ptr<RewardPeer> reward;
  std::unique_ptr<BufferPeer> buffer;
  std::unique_ptr<TrainerPeer> trainer;
};
using PeerFactory = std::function<absl::StatusOr<RunPeers>()>;

// The loop's settings from a v1::RunConfig. INVALID_ARGUMENT naming the field
// ("config.group_size: ..."). A dataset and its tokenizer directory must lie under
// `data_root` (the controller's --data_root; empty: datasets are refused).
absl::StatusOr<LoopConfig> LoopConfigFromRun(const v1::RunConfig& config, const std::string& data_root = "");

class RunManager {
 public:
  // `log` gets one line per event (run started / finished, replica dropped, eval).
  // With `runs_dir`, each run writes its metrics and curves (run_metrics.h) into
  // runs_dir/<run id>. With `store` (not owned), the run is saved there when it starts,
  // after every step and when it ends, and Recover resumes it.
  RunManager(PeerFactory peers, std::function<void(const std::string&)> log, std::string runs_dir = "",
             RunStore* store = nullptr, std::string data_root = "");
  ~RunManager();  // stops an active run and waits for it (its record stays active)

  // Once, at start: reads the store's record. A run that had ended is reported by Fill
  // as the last run; one that was active when the previous controller died resumes
  // after its last saved step (LoopConfig::resume) as soon as its peers can be made
  // (with at least config.rollout_replicas rollout replicas, retried every second up
  // to `peers_within`; then it ends FAILED saying why); one that was stopping ends
  // STOPPED. Returns the store's error when the record cannot be read (no run is
  // resumed then).
  absl::Status Recover(absl::Duration peers_within = absl::Minutes(5));

  // Starts a run; returns its id (`run_id`, or a new one). INVALID_ARGUMENT naming
  // the field for a run_id that is not a path-safe id (ValidatePathId: it names the
  // folder runs_dir/<id>) or for the config (every field is honoured or refused:
  // UNIMPLEMENTED for model and for algorithms other than GRPO); ALREADY_EXISTS for a
  // run_id used before; FAILED_PRECONDITION while a run is active or with fewer rollout
  // replicas than config.rollout_replicas; the factory's error when peers cannot be
  // made. Checkpoints (config.checkpoint_dir, a folder on the trainer's machine): every
  // checkpoint_interval_steps steps and after the last one when the run completes
  // (interval 0: none), and at StopRun with checkpoint; each to
  // <checkpoint_dir>/<run id>-step-<N>, the trainer keeping the newest
  // config.checkpoint_keep_last of them (unset: 3; 0: all). A periodic one that fails
  // is logged and counted (MetricsSummary.failed_checkpoints) and the run goes on; the
  // one at completion and StopRun's report their failure.
  absl::StatusOr<std::string> Start(const v1::RunConfig& config, const std::string& run_id);
  // Asks the active run to stop after its current step (and, with `checkpoint`, to save
  // one then) and waits up to `grace`. NOT_FOUND for a run_id that is not the current
  // one; FAILED_PRECONDITION for `checkpoint` without config.checkpoint_dir, or on a run
  // that already ended without one; DEADLINE_EXCEEDED when it has not stopped within
  // `grace` (it then ends FAILED); OK when none is active.
  absl::Status Stop(const std::string& run_id, bool checkpoint, absl::Duration grace, v1::StopRunResponse* response);
  // Fills the run fields of a status reply: run_id, state, step, metrics, config,
  // started_at_unix_ms, error.
  void Fill(v1::GetStatusResponse* response);

  // Scaling the active run (registry discovery calls these): a rollout replica joins
  // with the run's current weights, or leaves drained (RolloutPool::Admit / Remove).
  // FAILED_PRECONDITION without an active run.
  absl::Status AdmitRollout(std::unique_ptr<RolloutReplica> replica);
  absl::Status RemoveRollout(const std::string& address);
  // Whether a run's loop is running (its pool takes AdmitRollout / RemoveRollout).
  bool HasActiveRun();
  // The active run's rollout replicas (empty without one).
  std::vector<std::string> RolloutAddresses();
  // The active run's progress after its last step (none without an active run, or
  // before its first step).
  std::optional<LoopProgress> ActiveProgress();

 private:
  void Body(LoopConfig config, RunPeers peers);
  // Saves the run's record (when there is a store); a failure is logged, once per
  // outage, and the run goes on.
  void Persist();

  const PeerFactory peers_;
  const std::function<void(const std::string&)> log_;
  const std::string runs_dir_;
  const std::string data_root_;  // datasets and tokenizer directories a run names lie under it
  RunStore* const store_;
  // Saves one at a time, each of the state as it is then (a Stop's record is never
  // overwritten by an older step's).
  absl::Mutex store_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool store_failing_ ABSL_GUARDED_BY(store_mu_) = false;
  std::atomic<bool> stop_{false};
  std::atomic<bool> shutting_down_{false};  // the destructor: the run is left to resume
  // Start, Recover and the destructor one at a time: the check that no run is active,
  // the id's reservation, the peers and the run's thread are one step.
  absl::Mutex start_mu_ ABSL_ACQUIRED_BEFORE(store_mu_);
  std::thread thread_ ABSL_GUARDED_BY(start_mu_);
  absl::Mutex mu_;
  std::string run_id_ ABSL_GUARDED_BY(mu_);
  v1::RunState state_ ABSL_GUARDED_BY(mu_) = v1::RUN_STATE_IDLE;
  v1::RunConfig config_ ABSL_GUARDED_BY(mu_);
  LoopProgress progress_ ABSL_GUARDED_BY(mu_);
  float last_exact_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time started_ ABSL_GUARDED_BY(mu_);
  std::string error_ ABSL_GUARDED_BY(mu_);
  std::string run_dir_ ABSL_GUARDED_BY(mu_);
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_checkpoint_ ABSL_GUARDED_BY(mu_) = false;               // StopRun asked for a checkpoint
  bool stop_timed_out_ ABSL_GUARDED_BY(mu_) = false;                // StopRun's grace ran out: ends FAILED
  std::string checkpoint_path_ ABSL_GUARDED_BY(mu_);                // the run's last checkpoint
  int resumes_ ABSL_GUARDED_BY(mu_) = 0;                            // times Recover resumed it
  absl::flat_hash_set<std::string> used_ids_ ABSL_GUARDED_BY(mu_);  // run ids started here
  // The active run's pool while its loop runs (a mutex of its own: scaling waits for
  // the pool's current call, and must not hold up GetStatus meanwhile).
  absl::Mutex pool_mu_;
  RolloutPool* pool_ ABSL_GUARDED_BY(pool_mu_) = nullptr;
};

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_RUN_MANAGER_H_

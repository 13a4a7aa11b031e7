// A run's files: metrics.csv (a row per step), a TensorBoard event file of the same
// scalars, and, at the end, reward_curve.png
// (training reward and held-out exact match over steps and over wall time) and
// reward_curve.txt (the same over steps as text), drawn by gnuplot. Used by
// `rlfleet loop` and by the controller's runs. Not thread-safe.
#ifndef RLFLEET_SERVICES_CONTROLLER_RUN_METRICS_H_
#define RLFLEET_SERVICES_CONTROLLER_RUN_METRICS_H_

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "libs/metrics/event_file.h"
#include "services/controller/run_loop.h"

namespace rlfleet::controller {

class RunMetrics {
 public:
  // Creates `dir` and metrics.csv in it; with `append` (a resumed run), a metrics.csv
  // already there keeps its rows and gets the new ones after them. Also a TensorBoard
  // event file (events.out.tfevents.*) there with every step's scalars (train/*,
  // perf/*, heldout/exact_match): `tensorboard --logdir` on the runs folder shows every
  // run; a resumed run starts a new file (TensorBoard joins them by step). INTERNAL
  // naming the path when it cannot.
  absl::Status Open(const std::filesystem::path& dir, bool append = false);
  void Add(const LoopProgress& progress);
  // Closes the CSV and draws the curves. Returns a line for the user: where the files
  // are, or why there is no plot (no gnuplot installed).
  std::string Finish();
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::ofstream csv_;
  metrics::EventFileWriter events_;
  bool events_failed_ = false;
};

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_RUN_METRICS_H_

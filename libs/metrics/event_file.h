// TensorBoard event files: scalars per step, in the format TensorBoard (and W&B's
// TensorBoard sync) reads: TFRecord records (length, masked CRC-32C of it, the bytes,
// masked CRC-32C of them), each an Event protobuf: first {wall_time, file_version
// "brain.Event:2"}, then {wall_time, step, summary {value {tag, simple_value}}}.
// Hand-encoded (five fields of two messages), so no TensorFlow or TensorBoard proto is
// needed to build. Not thread-safe.
#ifndef RLFLEET_LIBS_METRICS_EVENT_FILE_H_
#define RLFLEET_LIBS_METRICS_EVENT_FILE_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rlfleet::metrics {

// CRC-32C (Castagnoli), and TFRecord's mask of it.
uint32_t Crc32c(absl::string_view data);
uint32_t MaskedCrc32c(absl::string_view data);

class EventFileWriter {
 public:
  // Creates `dir`/events.out.tfevents.<unix seconds>.<host> and writes the file-version
  // event. INTERNAL naming the path when it cannot.
  absl::Status Open(const std::string& dir, absl::Time now = absl::Now());
  // One event of `step` with a scalar per (tag, value), flushed (a run read while it
  // goes, or killed, keeps every step written). Non-finite values are written as they
  // are (TensorBoard shows them).
  absl::Status AddScalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                          absl::Time now = absl::Now());
  const std::string& path() const { return path_; }

 private:
  absl::Status WriteRecord(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

}  // namespace rlfleet::metrics

#endif  // RLFLEET_LIBS_METRICS_EVENT_FILE_H_

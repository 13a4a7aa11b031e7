// A run file: one YAML document that describes a whole run and its fleet, read by every
// binary with --config=run.yaml (a file ending in .yaml or .yml; any other --config is
// the `name = value` format of config.h). Each binary takes the sections it reads as
// its flags (flags on the command line still win):
//
//   model:      written once; every binary with these flags reads them (rollout,
//               trainer, rlfleet): dir (= model_dir), d_model, n_layers, n_heads,
//               max_seq_len
//   transport:  every binary with these flags: data_plane, data_plane_devices,
//               data_plane_tls, data_plane_secret_file, numa
//   nccl:       every binary with it: profile (= nccl_profile)
//   data, algorithm, run:
//               rlfleet (the CLI: `rlfleet run --config=run.yaml`): its flags, e.g.
//               dataset, prompt_field, steps, lr, loop_samples, eval_every
//   controller, rollout, reward, buffer, trainer, weights, gateway:
//               rlfleet-<section>: its flags (port, precision, ...)
//   fleet:      deploy/local/launch.sh: rollouts (the replica count)
//
// Keys are flag names (the shared sections' keys are listed above). A value is a
// scalar, a list of scalars (joined by commas) or a mapping (given as JSON, e.g.
// chat_template_kwargs: {enable_thinking: false}). An unknown section, a key a shared
// section does not have, a key the reading binary has no flag for, or a value its flag
// cannot parse is an error naming the file, the line and the key.
#ifndef RLFLEET_LIBS_COMMON_RUN_FILE_H_
#define RLFLEET_LIBS_COMMON_RUN_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/common/config.h"

namespace rlfleet::common {

// Whether a --config path is a run file (ends in .yaml or .yml).
bool IsRunFile(absl::string_view path);

// The entries of run file `text` that `binary` (its file name: rlfleet-trainer,
// rlfleet, ...) reads, in file order, each with its line and its key in the file
// ("model.dir"); entries of the shared sections are `optional` (a binary without that
// flag skips them). `origin` names the file in errors. INVALID_ARGUMENT naming
// origin:line for YAML that does not parse, a document that is not a mapping, an
// unknown section, a section that is not a mapping, a key a shared section does not
// have, or a value that is neither a scalar, a list of scalars nor a mapping.
absl::StatusOr<std::vector<ConfigEntry>> ParseRunFile(absl::string_view text, absl::string_view origin,
                                                      absl::string_view binary);

// One value of a run file, as text (a list joined by commas, a mapping as JSON):
// `section.key`. NOT_FOUND when absent; errors as ParseRunFile's.
absl::StatusOr<std::string> RunFileValue(absl::string_view text, absl::string_view origin,
                                         absl::string_view section_key);

// Reads a file of at most kMaxConfigFileBytes and parses it for `binary`.
absl::StatusOr<std::vector<ConfigEntry>> ReadRunFile(const std::string& path, absl::string_view binary);

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_RUN_FILE_H_

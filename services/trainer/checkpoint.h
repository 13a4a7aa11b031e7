// A trainer checkpoint on disk: a directory holding weights.safetensors,
// optimizer.safetensors (when the optimizer has state) and state.txt (a format line,
// step, version, model config, a digest per file). This file reads and checks one
// without a lock (every file it names resolves inside the directory, is a regular
// file and has its size checked before it is read: a state.txt cannot make the
// trainer read /dev/zero, a FIFO or a host file), and removes one only when it is a
// checkpoint this trainer wrote. Errors never echo a file's contents. Stateless;
// thread-safe.
#ifndef RLFLEET_SERVICES_TRAINER_CHECKPOINT_H_
#define RLFLEET_SERVICES_TRAINER_CHECKPOINT_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/model/hf_model.h"

namespace rlfleet::trainer {

inline constexpr char kStateFile[] = "state.txt";
inline constexpr char kWeightsFile[] = "weights.safetensors";
inline constexpr char kOptimizerFile[] = "optimizer.safetensors";
inline constexpr char kFormatLine[] = "format rlfleet-trainer-checkpoint-1";
// A Llama-family model's checkpoint is also a Hugging Face model directory
// (`from_pretrained` loads it): its weights under this name, config.json beside them
// and the tokenizer files of the directory it started from.
inline constexpr char kHfWeightsFile[] = "model.safetensors";
inline constexpr char kHfConfigFile[] = "config.json";
using model::kHfTokenizerFiles;  // (hf_model.h)
inline constexpr uint64_t kMaxStateBytes = 64 << 10;

// FNV-1a 64 of `bytes` as 16 hex digits (the digest state.txt records per file).
std::string CheckpointDigest(absl::string_view bytes);

// What a checkpoint holds, read and verified.
struct CheckpointContents {
  uint64_t step = 0;
  uint64_t version = 0;
  std::string config;                    // the model config line ("" in old checkpoints)
  std::string weights;                   // weights.safetensors (or model.safetensors)
  std::optional<std::string> optimizer;  // optimizer.safetensors, when saved
};

// Reads the checkpoint at `dir` (a path already resolved under the checkpoint root),
// each file at most `max_file_bytes`. NOT_FOUND without a state.txt; DATA_LOSS for a
// corrupt state.txt (no version, a file name that is not a plain name) or a digest
// mismatch; INVALID_ARGUMENT for a named file outside `dir`, not regular, or too large.
absl::StatusOr<CheckpointContents> ReadCheckpoint(const std::filesystem::path& dir, uint64_t max_file_bytes);

// OK if `dir` is a checkpoint directory as this trainer writes them: a real directory
// (not a link) whose entries are only checkpoint files (regular files: state, weights,
// optimizer state, a Hugging Face model's config and tokenizer files), state.txt among
// them. FAILED_PRECONDITION otherwise (overwrite never removes anything else).
absl::Status CheckIsCheckpoint(const std::filesystem::path& dir);

// Removes a directory that CheckIsCheckpoint accepts: its files by name, then the
// directory (never a recursive remove).
absl::Status RemoveCheckpoint(const std::filesystem::path& dir);

// A save's working directories beside its checkpoint `dir`: `<dir>.tmp-<owner>-<n>`,
// which it writes into and renames to `dir`, and `<dir>.old-<owner>-<n>`, where an
// overwrite moves the checkpoint it replaces until the new one has its name. `owner`
// tags them with the trainer that saves (--checkpoint_owner), so that a trainer cleans
// up only after its own saves; `n` is the save's start (Unix nanoseconds).
inline constexpr char kDefaultCheckpointOwner[] = "trainer";
std::filesystem::path SaveDir(const std::filesystem::path& dir, absl::string_view kind /* "tmp" or "old" */,
                              absl::string_view owner, uint64_t n);
// OK for an owner tag: 1..40 characters of [A-Za-z0-9_]; INVALID_ARGUMENT otherwise.
absl::Status ValidateCheckpointOwner(absl::string_view owner);

// Best effort: removes what a save wrote into `dir` (checkpoint files and the `.tmp`
// files a write leaves, by name) and then `dir` if that left it empty.
void RemovePartialCheckpoint(const std::filesystem::path& dir);

// The steps of a save, for tests that stop one where a kill would (SaveFault).
enum class SavePhase {
  kTmpCreated,      // the .tmp- directory exists, empty
  kWeightsWritten,  // the weights are in it
  kFilesWritten,    // every file, state.txt last, not yet synced
  kOldMovedAside,   // (overwrite) the checkpoint it replaces is at .old-, nothing at `dir`
  kRenamed,         // the new checkpoint has its name; (overwrite) .old- not yet removed
};
// Returns true to stop the save at that phase as a kill would: nothing undone.
using SaveFault = std::function<bool(SavePhase)>;

// Puts the checkpoint written into `tmp` (complete: state.txt written last) at `dir`:
// syncs tmp's files and tmp itself, moves an existing `dir` aside to `old` (when `old`
// is not empty), renames `tmp` to `dir`, syncs the parent directory, and removes `old`
// (RemoveCheckpoint) and syncs the parent again. INTERNAL on a failed sync or rename,
// with `tmp` removed and `dir` as it was. ABORTED when `fault` stopped it.
absl::Status CommitCheckpointDir(const std::filesystem::path& tmp, const std::filesystem::path& dir,
                                 const std::filesystem::path& old, const SaveFault& fault = {});

// Cleans up after saves by `owner` that did not finish (killed, or failed on a full
// disk), anywhere under `root` (at most `max_depth` directories down, links not
// followed): a `.tmp-<owner>-` directory is an unfinished save and is removed; an
// `.old-<owner>-` one is removed when its checkpoint's name holds a checkpoint again,
// and renamed back to that name when nothing is there (killed between the two renames
// of an overwrite: the checkpoint as it was before that save). Directories are removed
// file by file, and only files a save writes (checkpoint.h's names and the `.tmp` files
// a write leaves): one holding anything else, a directory of another owner, and every
// complete checkpoint stay. Returns a line per directory removed, restored or left.
std::vector<std::string> CleanInterruptedSaves(const std::filesystem::path& root, absl::string_view owner,
                                               int max_depth = 4);

// The checkpoint under `root` (at most `max_depth` directories down, links not
// followed) whose state.txt was written last; nullopt when there is none. Directories
// that CheckIsCheckpoint refuses are not candidates, nor the `.tmp-` folders a save
// writes into before it renames them, nor the `.old-` ones an overwrite moves aside.
std::optional<std::filesystem::path> FindLatestCheckpoint(const std::filesystem::path& root, int max_depth = 4);

// A checkpoint name of a series, `<name>-step-<N>` (as a run's checkpoints are named):
// its name and N; nullopt for any other form (N: 1 to 19 decimal digits, no sign; the
// name not empty).
struct SeriesName {
  std::string name;
  uint64_t step = 0;
};
std::optional<SeriesName> ParseSeriesName(absl::string_view dir_name);

// The largest SaveCheckpointRequest.keep_last.
inline constexpr uint32_t kMaxKeepLast = 100000;

// Retention of a series: after `saved` (`<folder>/<name>-step-<N>`) was written, removes
// the checkpoints `<folder>/<name>-step-<M>` of the same folder and name beyond the
// newest `keep_last` by M, `saved` always among those kept (it is what a resume loads).
// Only directories of exactly that form (another name's series, a `.tmp-` or `.old-`
// save directory never match) and only ones RemoveCheckpoint accepts are removed.
// keep_last 0: nothing. INVALID_ARGUMENT when `saved`'s name is not of the form. The
// paths removed go to `removed`, a line per checkpoint that could not be to `errors`.
absl::Status PruneCheckpointSeries(const std::filesystem::path& saved, uint32_t keep_last,
                                   std::vector<std::string>* removed, std::vector<std::string>* errors);

}  // namespace rlfleet::trainer

#endif  // RLFLEET_SERVICES_TRAINER_CHECKPOINT_H_

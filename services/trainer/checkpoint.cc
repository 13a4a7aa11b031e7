#include "services/trainer/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/common/files.h"
#include "libs/common/status_macros.h"

namespace rlfleet::trainer {
namespace fs = std::filesystem;

std::string CheckpointDigest(absl::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (char c : bytes) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return absl::StrCat(absl::Hex(h, absl::kZeroPad16));
}

namespace {

bool IsCheckpointFile(const std::string& name) {
  if (name == kStateFile || name == kWeightsFile || name == kOptimizerFile || name == kHfWeightsFile ||
      name == kHfConfigFile) {
    return true;
  }
  for (const char* file : kHfTokenizerFiles) {
    if (name == file) return true;
  }
  return false;
}

// Reads `name` inside `dir`: a plain file name (fixed alphabet), resolved inside `dir`
// (a link out of it is refused), a regular file of at most `max_bytes`.
absl::StatusOr<std::string> ReadInside(const fs::path& dir, const std::string& name, uint64_t max_bytes) {
  if (!common::ValidatePathId("checkpoint file", name).ok()) {
    return absl::DataLossError(
        absl::StrCat(dir.string(), "/", kStateFile, " names a file that is not a plain file name"));
  }
  ASSIGN_OR_RETURN(fs::path path, common::ResolveUnderRoot(absl::StrCat("checkpoint file ", name), dir, name));
  return common::ReadRegularFile(absl::StrCat("checkpoint file ", name), path, max_bytes);
}

// A file a save writes: a checkpoint file, or the `.tmp` one WriteFileAtomically
// leaves when it is stopped mid-write.
bool IsSaveFile(const std::string& name) {
  return IsCheckpointFile(name) || (absl::EndsWith(name, ".tmp") && IsCheckpointFile(name.substr(0, name.size() - 4)));
}

// fsync of a file or a directory.
absl::Status Sync(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path.string(), " to sync: ", strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat("cannot sync ", path.string(), ": ", strerror(err)));
  return absl::OkStatus();
}

// Removes `dir` file by file when it holds only files a save writes; FAILED_PRECONDITION
// (nothing removed) when it holds anything else.
absl::Status RemoveSaveDir(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!IsSaveFile(name) || entry.symlink_status(ec).type() != fs::file_type::regular) {
      return absl::FailedPreconditionError(absl::StrCat("it holds ", name, ", which no save writes"));
    }
    files.push_back(entry.path());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list it: ", ec.message()));
  for (const fs::path& file : files) {
    fs::remove(file, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot remove ", file.string(), ": ", ec.message()));
  }
  fs::remove(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove it: ", ec.message()));
  return absl::OkStatus();
}

// A save directory of `owner`: `<base>.<kind>-<owner>-<digits>`.
struct SaveDirName {
  std::string base;  // the checkpoint's name
  std::string kind;  // "tmp" or "old"
  uint64_t n = 0;
};
std::optional<SaveDirName> ParseSaveDir(const std::string& name, absl::string_view owner) {
  for (const char* kind : {"tmp", "old"}) {
    const std::string marker = absl::StrCat(".", kind, "-", owner, "-");
    const size_t at = name.rfind(marker);
    if (at == std::string::npos || at == 0) continue;
    const std::string digits = name.substr(at + marker.size());
    uint64_t n = 0;
    if (digits.empty() || digits.size() > 20 || !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(digits, &n)) {
      continue;
    }
    return SaveDirName{name.substr(0, at), kind, n};
  }
  return std::nullopt;
}

}  // namespace

fs::path SaveDir(const fs::path& dir, absl::string_view kind, absl::string_view owner, uint64_t n) {
  return absl::StrCat(dir.string(), ".", kind, "-", owner, "-", n);
}

absl::Status ValidateCheckpointOwner(absl::string_view owner) {
  if (owner.empty() || owner.size() > 40 ||
      !std::all_of(owner.begin(), owner.end(), [](char c) { return absl::ascii_isalnum(c) || c == '_'; })) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint owner `", owner.substr(0, 40), "`: want 1..40 characters of [A-Za-z0-9_]"));
  }
  return absl::OkStatus();
}

void RemovePartialCheckpoint(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    if (IsSaveFile(entry.path().filename().string())) files.push_back(entry.path());
  }
  for (const fs::path& file : files) fs::remove(file, ec);
  fs::remove(dir, ec);  // (an empty directory only)
}

absl::Status CommitCheckpointDir(const fs::path& tmp, const fs::path& dir, const fs::path& old,
                                 const SaveFault& fault) {
  auto stopped = [&](SavePhase phase) { return fault && fault(phase); };
  auto abort = [] { return absl::AbortedError("save stopped by a test fault (as a kill would)"); };
  if (stopped(SavePhase::kFilesWritten)) return abort();
  // The files and the directory's entries reach the disk before the rename makes them
  // the checkpoint: a crash after it never finds a checkpoint with missing bytes.
  std::error_code ec;
  absl::Status synced;
  for (const fs::directory_entry& entry : fs::directory_iterator(tmp, ec)) {
    if (synced.ok() && entry.symlink_status(ec).type() == fs::file_type::regular) {
      synced = Sync(entry.path(), false);
    }
  }
  if (synced.ok()) synced = Sync(tmp, true);
  if (!synced.ok()) {
    RemovePartialCheckpoint(tmp);
    return synced;
  }
  if (!old.empty()) {
    fs::rename(dir, old, ec);
    if (ec) {
      RemovePartialCheckpoint(tmp);
      return absl::InternalError(absl::StrCat("cannot move the old checkpoint aside: ", ec.message()));
    }
    if (stopped(SavePhase::kOldMovedAside)) return abort();
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    std::error_code back;
    if (!old.empty()) fs::rename(old, dir, back);
    RemovePartialCheckpoint(tmp);
    return absl::InternalError(absl::StrCat("cannot rename into ", dir.string(), ": ", ec.message()));
  }
  // (then the renames themselves are durable)
  RETURN_IF_ERROR(Sync(dir.parent_path(), true));
  if (stopped(SavePhase::kRenamed)) return abort();
  if (!old.empty()) {
    (void)RemoveCheckpoint(old);  // (left behind, CleanInterruptedSaves removes it later)
    (void)Sync(dir.parent_path(), true);
  }
  return absl::OkStatus();
}

std::vector<std::string> CleanInterruptedSaves(const fs::path& root, absl::string_view owner, int max_depth) {
  std::vector<std::string> lines;
  if (!ValidateCheckpointOwner(owner).ok()) return lines;
  std::error_code ec;
  // Every save directory of this owner, breadth-first over real directories (links are
  // not followed); neither save directories nor checkpoints are searched further.
  std::map<fs::path, std::vector<std::pair<uint64_t, fs::path>>> olds;  // checkpoint path -> its .old- dirs
  std::vector<fs::path> tmps;
  std::vector<fs::path> level = {root};
  for (int depth = 0; depth <= max_depth && !level.empty(); ++depth) {
    std::vector<fs::path> next;
    for (const fs::path& dir : level) {
      for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
        if (entry.symlink_status(ec).type() != fs::file_type::directory) continue;
        const std::string name = entry.path().filename().string();
        if (std::optional<SaveDirName> save = ParseSaveDir(name, owner)) {
          if (save->kind == "tmp") {
            tmps.push_back(entry.path());
          } else {
            olds[dir / save->base].emplace_back(save->n, entry.path());
          }
        } else if (name.find(".tmp-") == std::string::npos && name.find(".old-") == std::string::npos &&
                   !CheckIsCheckpoint(entry.path()).ok()) {
          next.push_back(entry.path());
        }
      }
      ec.clear();
    }
    level = std::move(next);
  }
  auto remove = [&](const fs::path& dir, absl::string_view what) {
    const absl::Status s = RemoveSaveDir(dir);
    lines.push_back(s.ok() ? absl::StrCat("removed ", dir.string(), " (", what, ")")
                           : absl::StrCat("left ", dir.string(), " (", what, "): ", s.message()));
  };
  for (auto& [checkpoint, dirs] : olds) {
    std::sort(dirs.rbegin(), dirs.rend());  // newest first
    size_t first = 0;
    if (fs::symlink_status(checkpoint, ec).type() == fs::file_type::not_found &&
        CheckIsCheckpoint(dirs[0].second).ok()) {
      fs::rename(dirs[0].second, checkpoint, ec);
      if (!ec) {
        lines.push_back(absl::StrCat("restored ", checkpoint.string(), " from ", dirs[0].second.string(),
                                     " (an overwrite stopped between its renames)"));
        (void)Sync(checkpoint.parent_path(), true);
        first = 1;
      }
    }
    for (size_t i = first; i < dirs.size(); ++i) remove(dirs[i].second, "the checkpoint an overwrite replaced");
  }
  for (const fs::path& dir : tmps) remove(dir, "a save that did not finish");
  return lines;
}

absl::StatusOr<CheckpointContents> ReadCheckpoint(const fs::path& dir, uint64_t max_file_bytes) {
  std::error_code ec;
  if (fs::symlink_status(dir, ec).type() != fs::file_type::directory) {
    return absl::NotFoundError(absl::StrCat("no checkpoint at ", dir.string()));
  }
  absl::StatusOr<std::string> state = ReadInside(dir, kStateFile, kMaxStateBytes);
  if (absl::IsNotFound(state.status())) return absl::NotFoundError(absl::StrCat("no checkpoint at ", dir.string()));
  RETURN_IF_ERROR(state.status());
  // Lines of `key value...`: format, step, version, config, digest <file> <hex>.
  CheckpointContents out;
  std::map<std::string, std::string> digests;
  std::istringstream in(*state);
  for (std::string key; in >> key;) {
    if (key == "step") {
      in >> out.step;
    } else if (key == "version") {
      in >> out.version;
    } else if (key == "config") {
      in >> out.config;
    } else if (key == "digest") {
      std::string file, hex;
      in >> file >> hex;
      digests[file] = hex;
    } else {
      std::string rest;
      std::getline(in, rest);  // the format line, or a later version's key: ignored
    }
    if (in.fail()) return absl::DataLossError(absl::StrCat(dir.string(), "/", kStateFile, " is corrupt"));
  }
  if (out.version == 0)
    return absl::DataLossError(absl::StrCat(dir.string(), "/", kStateFile, " is corrupt (no version)"));
  if (digests.size() > 16)
    return absl::DataLossError(absl::StrCat(dir.string(), "/", kStateFile, " names too many files"));
  std::map<std::string, std::string> files;
  for (const auto& [file, want] : digests) {
    ASSIGN_OR_RETURN(std::string bytes, ReadInside(dir, file, max_file_bytes));
    if (CheckpointDigest(bytes) != want) {
      // (the name passed the plain-name check; neither digest is echoed)
      return absl::DataLossError(
          absl::StrCat(dir.string(), "/", file, " is corrupt: its digest differs from ", kStateFile, "'s"));
    }
    files[file] = std::move(bytes);
  }
  auto present = [&](const char* name) {
    return files.count(name) != 0 || (fs::symlink_status(dir / name, ec).type() != fs::file_type::not_found && !ec);
  };
  const char* weights = present(kHfWeightsFile) ? kHfWeightsFile : kWeightsFile;
  for (const char* name : {weights, kOptimizerFile}) {
    if (files.count(name)) continue;
    if (!present(name) && name == std::string(kOptimizerFile)) continue;  // saved before the first step
    ASSIGN_OR_RETURN(files[name], ReadInside(dir, name, max_file_bytes));
  }
  out.weights = std::move(files[weights]);
  if (auto it = files.find(kOptimizerFile); it != files.end()) out.optimizer = std::move(it->second);
  return out;
}

absl::Status CheckIsCheckpoint(const fs::path& dir) {
  auto refuse = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat(dir.string(), " is not a checkpoint this trainer wrote (", why,
                                                      "); overwrite replaces only those"));
  };
  std::error_code ec;
  if (fs::symlink_status(dir, ec).type() != fs::file_type::directory) return refuse("not a directory");
  bool has_state = false;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!IsCheckpointFile(name)) return refuse("it holds other files");
    if (entry.symlink_status(ec).type() != fs::file_type::regular) return refuse("a checkpoint file is not regular");
    has_state |= name == kStateFile;
  }
  if (ec) return refuse(ec.message());
  if (!has_state) return refuse(absl::StrCat("no ", kStateFile));
  return absl::OkStatus();
}

absl::Status RemoveCheckpoint(const fs::path& dir) {
  RETURN_IF_ERROR(CheckIsCheckpoint(dir));
  std::error_code ec;
  std::vector<fs::path> files;  // (checkpoint files only: checked above)
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) files.push_back(entry.path());
  for (const fs::path& file : files) {
    fs::remove(file, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot remove ", file.string(), ": ", ec.message()));
  }
  fs::remove(dir, ec);  // an empty directory only
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", dir.string(), ": ", ec.message()));
  return absl::OkStatus();
}

std::optional<fs::path> FindLatestCheckpoint(const fs::path& root, int max_depth) {
  std::optional<fs::path> best;
  fs::file_time_type best_time;
  std::error_code ec;
  // Breadth-first over real directories (links are not followed), `max_depth` deep.
  std::vector<fs::path> level = {root};
  for (int depth = 0; depth <= max_depth && !level.empty(); ++depth) {
    std::vector<fs::path> next;
    for (const fs::path& dir : level) {
      const std::string name = dir.filename().string();
      // (a save in progress, or the one an overwrite moved aside)
      if (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos) continue;
      if (depth > 0 && CheckIsCheckpoint(dir).ok()) {
        const fs::file_time_type t = fs::last_write_time(dir / kStateFile, ec);
        if (!ec && (!best.has_value() || t > best_time)) {
          best = dir;
          best_time = t;
        }
        continue;
      }
      for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
        if (entry.symlink_status(ec).type() == fs::file_type::directory) next.push_back(entry.path());
      }
      ec.clear();
    }
    level = std::move(next);
  }
  return best;
}

std::optional<SeriesName> ParseSeriesName(absl::string_view dir_name) {
  constexpr absl::string_view kStep = "-step-";
  const size_t at = dir_name.rfind(kStep);
  if (at == absl::string_view::npos || at == 0) return std::nullopt;
  const absl::string_view digits = dir_name.substr(at + kStep.size());
  if (digits.empty() || digits.size() > 19) return std::nullopt;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  SeriesName series;
  if (!absl::SimpleAtoi(digits, &series.step)) return std::nullopt;
  series.name = std::string(dir_name.substr(0, at));
  return series;
}

absl::Status PruneCheckpointSeries(const fs::path& saved, uint32_t keep_last, std::vector<std::string>* removed,
                                   std::vector<std::string>* errors) {
  const std::optional<SeriesName> own = ParseSeriesName(saved.filename().string());
  if (!own.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_last: ", saved.filename().string(), " is not a series checkpoint's name (<name>-step-<N>)"));
  }
  if (keep_last == 0) return absl::OkStatus();
  std::error_code ec;
  std::vector<std::pair<uint64_t, fs::path>> others;  // the series but `saved`
  for (const fs::directory_entry& entry : fs::directory_iterator(saved.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    const std::optional<SeriesName> series = ParseSeriesName(name);
    if (!series.has_value() || series->name != own->name || name == saved.filename().string()) continue;
    if (!entry.is_directory(ec) || entry.is_symlink(ec)) continue;
    others.emplace_back(series->step, entry.path());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", saved.parent_path().string(), ": ", ec.message()));
  // The newest keep_last - 1 others stay beside `saved`; by step, then by name (a step
  // written with leading zeros is another directory of the same step).
  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second.filename() > b.second.filename();
  });
  for (size_t i = keep_last - 1; i < others.size(); ++i) {
    const absl::Status s = RemoveCheckpoint(others[i].second);
    if (s.ok()) {
      removed->push_back(others[i].second.string());
    } else {
      errors->push_back(std::string(s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::trainer

#include "services/trainer/checkpoint.h"

#include <map>
#include <sstream>
#include <vector>

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

}  // namespace

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

}  // namespace rlfleet::trainer

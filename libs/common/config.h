// Configuration: command-line flags (absl) plus an optional config file.
//
// A config file holds `name = value` lines, one flag per line, where `name` is a flag's
// name without dashes; blank lines are ignored. A `#` starts a comment only at the start
// of a line or right after whitespace (a space or tab): `auth_token = ab#cd` sets the
// value `ab#cd`, `port = 7000  # the port` sets `7000`. A value therefore cannot hold a
// `#` that follows whitespace. Whitespace around names and values is dropped. Values from the
// file become the flags' values, and flags given on the command line override them:
//
//   # controller.conf
//   port = 7000
//   auth_token_file = /etc/rlfleet/token
//
//   rlfleet-controller --config=controller.conf --port=7001   # port 7001 wins
#ifndef RLFLEET_LIBS_COMMON_CONFIG_H_
#define RLFLEET_LIBS_COMMON_CONFIG_H_

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

ABSL_DECLARE_FLAG(std::string, config);

namespace rlfleet::common {

// Config files larger than this are refused (they are hand-written, not data).
inline constexpr size_t kMaxConfigFileBytes = 1 << 20;

struct ConfigEntry {
  std::string key;  // the flag
  std::string value;
  int line = 0;           // 1-based line number in the file, for error messages.
  std::string source;     // the key as the file spells it, when not the flag's name ("model.dir")
  bool optional = false;  // skipped by a binary without this flag (a run file's shared sections)
};

// Parses config text. `origin` names the source in errors ("file.conf:3: ...").
// INVALID_ARGUMENT for a line without '=', an empty key or a key given twice.
absl::StatusOr<std::vector<ConfigEntry>> ParseConfigText(absl::string_view text, absl::string_view origin);

// Reads and parses a config file. NOT_FOUND if it cannot be opened, INVALID_ARGUMENT if
// it is larger than kMaxConfigFileBytes or malformed.
absl::StatusOr<std::vector<ConfigEntry>> ReadConfigFile(const std::string& path);
// A config file's text (NOT_FOUND, or INVALID_ARGUMENT when over kMaxConfigFileBytes).
absl::StatusOr<std::string> ReadConfigFileText(const std::string& path);

// Sets each entry's absl flag. INVALID_ARGUMENT naming origin:line for an unknown flag
// (an optional entry's is skipped) or a value the flag cannot parse, naming the key as
// the file spells it. Entries before a failing one stay applied.
absl::Status ApplyConfigToFlags(const std::vector<ConfigEntry>& entries, absl::string_view origin);

// Parses the command line the way every rlfleet binary does: finds --config=PATH (or
// `--config PATH`), applies that file (a run file, run_file.h, when it ends in .yaml or
// .yml: the sections argv[0]'s file name reads), then parses argv so command-line flags
// win.
// Prints the error and exits with status 2 on a bad flag or config file. Returns the
// positional arguments, argv[0] first.
std::vector<std::string> ParseFlagsWithConfig(int argc, char** argv, absl::string_view usage);

// Whether flag `name` holds a value other than its default (given on the command line
// or in the config file; Debian's absl does not say whether a flag set to its default
// value was given), for flags that other flags make meaningless.
bool FlagWasGiven(absl::string_view name);

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_CONFIG_H_

#include "libs/common/config.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "libs/common/run_file.h"
#include "libs/common/status_macros.h"

ABSL_FLAG(std::string, config, "", "Path of a config file of `flag = value` lines; command-line flags override it.");

namespace rlfleet::common {
namespace {

// `line` up to its comment: a `#` at the start of the line or right after whitespace
// (so `ab#cd` is a value, `7000  # port` is 7000 and a comment).
absl::string_view StripComment(absl::string_view line) {
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '#' && (i == 0 || absl::ascii_isspace(static_cast<unsigned char>(line[i - 1])))) {
      return line.substr(0, i);
    }
  }
  return line;
}

}  // namespace

absl::StatusOr<std::vector<ConfigEntry>> ParseConfigText(absl::string_view text, absl::string_view origin) {
  std::vector<ConfigEntry> entries;
  absl::flat_hash_set<std::string> seen;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = StripComment(line);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ":", line_no, ": expected `name = value`, got `", line, "`"));
    }
    ConfigEntry entry;
    absl::string_view key = absl::StripAsciiWhitespace(line.substr(0, eq));
    absl::ConsumePrefix(&key, "--");
    entry.key = std::string(key);
    entry.value = std::string(absl::StripAsciiWhitespace(line.substr(eq + 1)));
    entry.line = line_no;
    if (entry.key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ":", line_no, ": empty name"));
    }
    if (!seen.insert(entry.key).second) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ":", line_no, ": `", entry.key, "` is set twice"));
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

absl::StatusOr<std::vector<ConfigEntry>> ReadConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadConfigFileText(path));
  return ParseConfigText(text, path);
}

absl::StatusOr<std::string> ReadConfigFileText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open config file ", path));
  std::string text;
  text.resize(kMaxConfigFileBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxConfigFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", path, " is larger than ", kMaxConfigFileBytes, " bytes"));
  }
  return text;
}

absl::Status ApplyConfigToFlags(const std::vector<ConfigEntry>& entries, absl::string_view origin) {
  for (const ConfigEntry& entry : entries) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(entry.key);
    const std::string name = entry.source.empty() ? entry.key : entry.source;
    if (flag == nullptr) {
      if (entry.optional) continue;  // a shared section's key this binary has no flag for
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ":", entry.line, ": unknown ", entry.source.empty() ? "flag" : "key", " `", name, "`"));
    }
    std::string error;
    if (!flag->ParseFrom(entry.value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ":", entry.line, ": bad value `", entry.value, "` for `", name, "`: ", error));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> ParseFlagsWithConfig(int argc, char** argv, absl::string_view usage) {
  absl::SetProgramUsageMessage(usage);
  std::string config_path;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (absl::ConsumePrefix(&arg, "--config=") || absl::ConsumePrefix(&arg, "-config=")) {
      config_path = std::string(arg);
    } else if ((arg == "--config" || arg == "-config") && i + 1 < argc) {
      config_path = argv[i + 1];
    }
  }
  if (!config_path.empty()) {
    // A run file (YAML): the sections this binary reads, by its file name.
    const std::string binary = std::filesystem::path(argc > 0 ? argv[0] : "").filename().string();
    absl::StatusOr<std::vector<ConfigEntry>> entries =
        IsRunFile(config_path) ? ReadRunFile(config_path, binary) : ReadConfigFile(config_path);
    absl::Status status = entries.ok() ? ApplyConfigToFlags(*entries, config_path) : entries.status();
    if (!status.ok()) {
      std::cerr << argv[0] << ": " << status.message() << "\n";
      std::exit(2);
    }
  }
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  return std::vector<std::string>(rest.begin(), rest.end());
}

bool FlagWasGiven(absl::string_view name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && flag->CurrentValue() != flag->DefaultValue();
}

}  // namespace rlfleet::common

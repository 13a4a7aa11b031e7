#include "tests/util/local_fleet.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace rlfleet::testing {

absl::StatusOr<std::string> StartLocalFleet(Subprocess* launcher, const std::string& dir, int rollouts,
                                            const std::vector<std::string>& env) {
  std::vector<std::string> argv = {"/usr/bin/env", "RLFLEET_BIN=" + RunfilePath("services")};
  argv.insert(argv.end(), env.begin(), env.end());
  for (const std::string& arg :
       {std::string("/bin/bash"), RunfilePath("deploy/local/launch.sh"), absl::StrCat("--rollouts=", rollouts),
        "--dir=" + dir, std::string("--"), std::string("--d_model=32"), std::string("--n_layers=2"),
        std::string("--n_heads=4"), std::string("--threads=1")}) {
    argv.push_back(arg);
  }
  absl::Status started = launcher->Start(argv);
  if (!started.ok()) return started;
  absl::StatusOr<std::string> up = launcher->WaitForLine(
      [](const std::string& l) { return absl::StrContains(l, "fleet up: controller "); }, absl::Seconds(180));
  if (!up.ok()) return absl::Status(up.status().code(), absl::StrCat(up.status().message(), "\n", launcher->output()));
  std::smatch m;
  if (!std::regex_search(*up, m, std::regex("controller (127\\.0\\.0\\.1:[0-9]+)"))) {
    return absl::InternalError(absl::StrCat("no controller address in: ", *up));
  }
  return m[1].str();
}

std::string FleetLogs(const std::string& dir, int lines) {
  std::vector<std::string> logs;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".log") logs.push_back(entry.path().string());
  }
  std::sort(logs.begin(), logs.end());
  std::string out;
  for (const std::string& path : logs) {
    std::ifstream in(path);
    std::vector<std::string> tail;
    for (std::string line; std::getline(in, line);) {
      tail.push_back(line);
      if (static_cast<int>(tail.size()) > lines) tail.erase(tail.begin());
    }
    absl::StrAppend(&out, "== ", std::filesystem::path(path).filename().string(), "\n");
    for (const std::string& line : tail) absl::StrAppend(&out, line, "\n");
  }
  return out;
}

}  // namespace rlfleet::testing

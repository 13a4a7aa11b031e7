#include "tests/util/local_fleet.h"

#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace rlfleet::testing {

absl::StatusOr<std::string> StartLocalFleet(Subprocess* launcher, const std::string& dir) {
  absl::Status started = launcher->Start({"/usr/bin/env", "RLFLEET_BIN=" + RunfilePath("services"), "/bin/bash",
                                          RunfilePath("deploy/local/launch.sh"), "--rollouts=1", "--dir=" + dir, "--",
                                          "--d_model=32", "--n_layers=2", "--n_heads=4", "--threads=1"});
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

}  // namespace rlfleet::testing

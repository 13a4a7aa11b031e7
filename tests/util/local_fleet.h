// The local fleet for integration tests: deploy/local/launch.sh started as a user
// would, with a small model, waited on until it says the fleet is up.
#ifndef RLFLEET_TESTS_UTIL_LOCAL_FLEET_H_
#define RLFLEET_TESTS_UTIL_LOCAL_FLEET_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/util/subprocess.h"

namespace rlfleet::testing {

// Starts the launcher in `launcher` (binaries and launch.sh from the test's runfiles:
// data deps //deploy/local:launch.sh and //services:fleet_binaries) with `rollouts`
// rollout replicas, logs in `dir`, and waits (180 s) for "fleet up". `env`: extra
// NAME=VALUE settings for the launcher (e.g. RLFLEET_PEER_TIMEOUT=20s). Returns the
// controller's address; the error carries the launcher's output.
absl::StatusOr<std::string> StartLocalFleet(Subprocess* launcher, const std::string& dir, int rollouts = 1,
                                            const std::vector<std::string>& env = {});

// The last `lines` lines of every service log in the launcher's `dir` (NAME.log), each
// under a "== NAME.log" header: what a failing test prints to say which service hung.
std::string FleetLogs(const std::string& dir, int lines = 30);

}  // namespace rlfleet::testing

#endif  // RLFLEET_TESTS_UTIL_LOCAL_FLEET_H_

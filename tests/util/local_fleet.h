// The local fleet for integration tests: deploy/local/launch.sh started as a user
// would, with a small model, waited on until it says the fleet is up.
#ifndef RLFLEET_TESTS_UTIL_LOCAL_FLEET_H_
#define RLFLEET_TESTS_UTIL_LOCAL_FLEET_H_

#include <string>

#include "absl/status/statusor.h"
#include "tests/util/subprocess.h"

namespace rlfleet::testing {

// Starts the launcher in `launcher` (binaries and launch.sh from the test's runfiles:
// data deps //deploy/local:launch.sh and //services:fleet_binaries) with one rollout
// replica, logs in `dir`, and waits (180 s) for "fleet up". Returns the controller's
// address; the error carries the launcher's output.
absl::StatusOr<std::string> StartLocalFleet(Subprocess* launcher, const std::string& dir);

}  // namespace rlfleet::testing

#endif  // RLFLEET_TESTS_UTIL_LOCAL_FLEET_H_

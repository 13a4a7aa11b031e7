// `rlfleet loop`: drives the RL loop across running services from the command line
// (rollout -> reward -> buffer -> trainer -> weights back to rollout), printing a
// reward curve. The controller's own run loop (StartRun) will take this over.
#ifndef RLFLEET_SERVICES_CONTROLLER_CLI_LOOP_H_
#define RLFLEET_SERVICES_CONTROLLER_CLI_LOOP_H_

#include "libs/rpc/client.h"

namespace rlfleet::controller {

// Returns the process exit code.
int RunLoop(const rpc::ClientOptions& base);

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_CLI_LOOP_H_

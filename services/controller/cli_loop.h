// `rlfleet loop`: drives the RL loop across running services from the command line
// (rollout -> reward -> buffer -> trainer -> weights back to rollout), printing a
// reward curve; `rlfleet run` / `rlfleet stop` have the controller run the same loop
// (StartRun) and watch it through GetStatus.
#ifndef RLFLEET_SERVICES_CONTROLLER_CLI_LOOP_H_
#define RLFLEET_SERVICES_CONTROLLER_CLI_LOOP_H_

#include "libs/rpc/client.h"
#include "services/controller/controller_client.h"

namespace rlfleet::controller {

// Returns the process exit code.
int RunLoop(const rpc::ClientOptions& base);
// `rlfleet run`: StartRun with the loop flags, then a progress line per evaluation until
// the run ends (exit 0 when COMPLETED or STOPPED, 1 when FAILED).
int StartRunAndWatch(ControllerClient& client);
// `rlfleet stop`: StopRun on the active run.
int StopRun(ControllerClient& client);

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_CLI_LOOP_H_

// The tail every rlfleet service's main shares, so that mains only wire: start the
// server, say where it listens, register with the controller (--registry_address),
// serve until SIGTERM / SIGINT, say that it stopped.
#ifndef RLFLEET_LIBS_SERVICE_SERVE_H_
#define RLFLEET_LIBS_SERVICE_SERVE_H_

#include <functional>
#include <map>
#include <string>

#include "libs/registry/registrar.h"
#include "libs/rpc/server_runner.h"
#include "rlfleet/v1/controller.pb.h"

namespace rlfleet::service {

struct ServeSpec {
  std::string binary;  // "rlfleet-weights": every line printed starts with it
  // The role it registers as with --registry_address; UNSPECIFIED: it does not
  // register (the controller is the registry).
  v1::ReplicaRole role = v1::REPLICA_ROLE_UNSPECIFIED;
  // After the server started, before the listening line (health from the core, a run
  // resumed, the consumer name from the address).
  std::function<void(rpc::ServerRunner& runner)> started;
  // Appended to the listening line (e.g. " (policy version 3)").
  std::function<std::string()> note;
  registry::Registrar::Fill fill;          // the replica's state in each heartbeat
  registry::Registrar::Rejoined rejoined;  // a lost lease registered again
  // After the termination signal, before the server's members go (threads that use them).
  std::function<void()> stopping;
  // More labels to register with (e.g. NumaLabels): the registry shows them, and
  // `rlfleet doctor --fleet` checks some.
  std::map<std::string, std::string> labels;
};

// Starts `runner` (its services added; with /metrics, the GPUs' metrics added to the
// process's), then as ServeSpec says, and serves until
// SIGTERM or SIGINT. The listening line names the address and, when they are on, the
// bearer token and TLS. Returns the process's exit code: 0, or 1 with the reason on
// stderr when the server does not start or the registration is refused.
// rpc::ServerOptionsFromFlags, with the registry's address (--registry_address) as the
// destination whose route picks the advertised address of a service bound to every
// interface.
absl::StatusOr<rpc::ServerOptions> ServerOptionsFromFlags();

int ServeUntilTerminated(rpc::ServerRunner& runner, const ServeSpec& spec);

}  // namespace rlfleet::service

#endif  // RLFLEET_LIBS_SERVICE_SERVE_H_

#include "libs/service/serve.h"

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/synchronization/mutex.h"
#include "libs/gpu/nvml.h"
#include "libs/metrics/metrics.h"

ABSL_FLAG(bool, mutex_deadlock_checks, false,
          "check absl::Mutex lock order at run time (a debugging aid: it costs every nested lock)");

namespace rlfleet::service {

absl::StatusOr<rpc::ServerOptions> ServerOptionsFromFlags() {
  // absl's lock-order checking is a debugging aid absl leaves off in release builds;
  // Debian builds its absl with it on, and then every lock taken while another is held
  // records an edge in a global graph (a twentieth of a busy controller's CPU under
  // loadtest/control_plane). The services run without it; tests keep it.
  if (!absl::GetFlag(FLAGS_mutex_deadlock_checks)) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  absl::StatusOr<rpc::ServerOptions> options = rpc::ServerOptionsFromFlags();
  if (options.ok()) options->advertise_route_to = registry::RegistryAddressFromFlags();
  return options;
}

int ServeUntilTerminated(rpc::ServerRunner& runner, const ServeSpec& spec) {
  // The GPUs' utilisation and memory beside the process's metrics (none without an
  // NVIDIA driver): here, so that libs/rpc does not depend on libs/gpu.
  if (runner.options().metrics_port >= 0) gpu::AddGpuMetrics(metrics::Global());
  if (absl::Status s = runner.Start(); !s.ok()) {
    std::cerr << spec.binary << ": " << s << "\n";
    return 1;
  }
  if (spec.started) spec.started(runner);
  const rpc::ServerOptions& options = runner.options();
  std::cout << spec.binary << " listening on " << runner.address() << (spec.note ? spec.note() : "")
            << (options.auth.token.empty() ? "" : " (bearer token required)")
            << (options.auth.tls_enabled_for_server() ? " (TLS)" : "") << std::endl;
  absl::StatusOr<std::unique_ptr<registry::Registrar>> registrar = nullptr;
  if (spec.role != v1::REPLICA_ROLE_UNSPECIFIED) {
    registrar = registry::RegisterFromFlags(spec.role, runner.address(), runner.metrics_port(), spec.fill, spec.binary,
                                            spec.rejoined, spec.labels);
    if (!registrar.ok()) {
      std::cerr << spec.binary << ": " << registrar.status() << "\n";
      return 1;
    }
  }
  const int signo = runner.WaitForTermination();
  if (spec.stopping) spec.stopping();
  std::cout << spec.binary << " stopped" << (signo ? " on signal" : "") << std::endl;
  return 0;
}

}  // namespace rlfleet::service

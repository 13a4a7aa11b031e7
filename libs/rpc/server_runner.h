// ServerRunner: builds, runs and gracefully stops one gRPC server for an rlfleet
// service binary.
//
// It serves the standard health service (grpc.health.v1; SERVING once started,
// NOT_SERVING from the start of shutdown), binds the requested address (port 0 picks a
// free port, reported by port()), applies the TLS options, and on Shutdown() or SIGTERM /
// SIGINT stops accepting calls and drains the ones in flight for up to drain_timeout
// before cancelling them.
//
// Thread safety: AddService and Start must be called from one thread before anything
// else; after Start, every method is thread-safe.
#ifndef RLFLEET_LIBS_RPC_SERVER_RUNNER_H_
#define RLFLEET_LIBS_RPC_SERVER_RUNNER_H_

#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/rpc/auth.h"

ABSL_DECLARE_FLAG(std::string, host);
ABSL_DECLARE_FLAG(int, port);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(absl::Duration, drain_timeout);
ABSL_DECLARE_FLAG(int, max_message_bytes);
ABSL_DECLARE_FLAG(int, metrics_port);
ABSL_DECLARE_FLAG(std::string, metrics_bind);

#include "libs/metrics/http_server.h"

namespace rlfleet::rpc {

// Default cap on one gRPC message, both directions. Bulk bytes go over libs/transport.
inline constexpr int kDefaultMaxMessageBytes = 16 << 20;

struct ServerOptions {
  // Address to bind; 127.0.0.1 (loopback) by default, 0.0.0.0 or :: to serve others.
  std::string host = "127.0.0.1";
  // 0 picks a free port; port() reports it after Start().
  int port = 0;
  // If set, Start() writes the bound port (decimal, newline) to this file atomically.
  std::string port_file;
  AuthOptions auth;
  // How long Shutdown() lets in-flight calls finish before cancelling them.
  absl::Duration drain_timeout = absl::Seconds(10);
  int max_message_bytes = kDefaultMaxMessageBytes;
  // Prometheus /metrics over HTTP on `host`: 0 picks a free port (printed at Start as
  // "metrics on http://HOST:PORT/metrics"), -1 serves none.
  int metrics_port = -1;
  // IPv4 address /metrics binds; empty binds `host` (:: as 0.0.0.0, ::1 as 127.0.0.1).
  std::string metrics_host;
  // The address others reach this server at (--advertise_address); empty: `host` when it
  // names one address, else the address of the interface that routes towards
  // `advertise_route_to` (the registry's target), else this host's first address
  // (advertise.h). What address() reports and the service registers.
  std::string advertise_host;
  std::string advertise_route_to;
  // Catch SIGTERM / SIGINT from Start() on (binaries: a signal that arrives between
  // Start and WaitForTermination is then a graceful stop, not the default kill).
  bool handle_signals = false;
};

// Reads --host, --advertise_address, --port, --port_file, --drain_timeout,
// --max_message_bytes, --metrics_port, --metrics_bind and the auth flags (auth.h).
absl::StatusOr<ServerOptions> ServerOptionsFromFlags();

class ServerRunner {
 public:
  explicit ServerRunner(ServerOptions options);
  ~ServerRunner();  // Shuts down (with drain) if still running.

  ServerRunner(const ServerRunner&) = delete;
  ServerRunner& operator=(const ServerRunner&) = delete;

  // Registers a service; `service` is not owned and must outlive the runner.
  void AddService(grpc::Service* service);

  // Builds and starts the server. INVALID_ARGUMENT for bad TLS options, NOT_FOUND for a
  // missing PEM file, UNAVAILABLE if the address cannot be bound (e.g. port in use).
  absl::Status Start();

  int port() const { return port_; }
  // The /metrics port (0 when none is served).
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  // host:port as a client would dial it ("[::1]:port" for IPv6 literals).
  std::string address() const;
  const ServerOptions& options() const { return options_; }

  // Sets what the health service reports for the whole server.
  void SetServing(bool serving);

  // Graceful stop: health NOT_SERVING, no new calls, in-flight calls drain for up to
  // drain_timeout, then are cancelled. Idempotent; returns when the server has stopped.
  void Shutdown();

  // Blocks until SIGTERM or SIGINT arrives or Shutdown() is called from another thread,
  // then shuts down gracefully. Returns the signal number, or 0 for Shutdown().
  int WaitForTermination();

 private:
  const ServerOptions options_;
  std::vector<grpc::Service*> services_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<metrics::MetricsServer> metrics_;
  int port_ = 0;
  std::string advertised_host_;  // (set by Start)
  int wake_fds_[2] = {-1, -1};   // written by Shutdown() to wake WaitForTermination().

  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace rlfleet::rpc

#endif  // RLFLEET_LIBS_RPC_SERVER_RUNNER_H_

#include "libs/rpc/server_runner.h"

#include <errno.h>
#include <fcntl.h>
#include <grpcpp/health_check_service_interface.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/common/files.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/advertise.h"
#include "libs/rpc/keepalive.h"

ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address to serve on (loopback by default; 0.0.0.0 or :: for all interfaces).");
ABSL_FLAG(std::string, advertise_address, "",
          "The address other hosts reach this service at: what it registers with the controller. Empty: --host "
          "when it names one address; when bound to every interface (0.0.0.0 or ::), the address of the interface "
          "that routes to --registry_address (not loopback), else this host's first address.");
ABSL_FLAG(int, port, 0, "Port to serve on; 0 picks a free one (see --port_file).");
ABSL_FLAG(std::string, port_file, "", "Write the bound port to this file once serving.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(10),
          "On SIGTERM, how long in-flight calls may finish before they are cancelled.");
ABSL_FLAG(int, max_message_bytes, rlfleet::rpc::kDefaultMaxMessageBytes,
          "Largest gRPC message accepted or sent, in bytes.");
ABSL_FLAG(int, metrics_port, 0,
          "Prometheus /metrics over HTTP on --host: 0 picks a free port (printed), -1 serves none.");
ABSL_FLAG(std::string, metrics_bind, "",
          "IPv4 address /metrics binds (e.g. 127.0.0.1 to keep it local while gRPC serves "
          "0.0.0.0); empty: the --host address.");

namespace rlfleet::rpc {
namespace {

// Self-pipe for termination signals: the handler only write()s (async-signal-safe).
int g_signal_pipe[2] = {-1, -1};

void OnTerminationSignal(int signo) {
  const unsigned char b = static_cast<unsigned char>(signo);
  const int saved = errno;
  if (g_signal_pipe[1] >= 0) (void)!write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

absl::Status InstallSignalHandlers() {
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  if (g_signal_pipe[0] >= 0) return absl::OkStatus();
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", strerror(errno)));
  }
  struct sigaction sa = {};
  sa.sa_handler = OnTerminationSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  return absl::OkStatus();
}

std::string JoinHostPort(const std::string& host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace

absl::StatusOr<ServerOptions> ServerOptionsFromFlags() {
  ServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.advertise_host = absl::GetFlag(FLAGS_advertise_address);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_host = absl::GetFlag(FLAGS_metrics_bind);
  options.handle_signals = true;
  options.port = absl::GetFlag(FLAGS_port);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port ", options.port, " is out of range"));
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError("--max_message_bytes must be positive");
  }
  ASSIGN_OR_RETURN(options.auth, AuthOptionsFromFlags());
  return options;
}

ServerRunner::ServerRunner(ServerOptions options) : options_(std::move(options)) {
  if (pipe2(wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) wake_fds_[0] = wake_fds_[1] = -1;
}

ServerRunner::~ServerRunner() {
  Shutdown();
  for (int fd : wake_fds_) {
    if (fd >= 0) close(fd);
  }
}

void ServerRunner::AddService(grpc::Service* service) { services_.push_back(service); }

absl::Status ServerRunner::Start() {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds, MakeServerCredentials(options_.auth));
  // (before binding: a bad --advertise_address starts nothing)
  std::string why;
  ASSIGN_OR_RETURN(advertised_host_,
                   AdvertisedHost(options_.host, options_.advertise_host, options_.advertise_route_to, &why));
  if (!why.empty()) std::cerr << program_invocation_short_name << ": " << why << std::endl;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  const std::string listen = JoinHostPort(options_.host, options_.port);
  builder.AddListeningPort(listen, creds, &port_);
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_message_bytes);
  // Without this, a restarted service could share a port with a still-running one.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  SetServerKeepalive(&builder);
  for (grpc::Service* service : services_) builder.RegisterService(service);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot serve on ", listen, " (address in use or not local?)"));
  }
  SetServing(true);
  if (options_.handle_signals) RETURN_IF_ERROR(InstallSignalHandlers());
  if (!options_.port_file.empty()) RETURN_IF_ERROR(common::WritePortFile(options_.port_file, port_));
  if (options_.metrics_port >= 0) {
    std::string host = options_.metrics_host.empty() ? options_.host : options_.metrics_host;
    if (host == "::" || host == "[::]") host = "0.0.0.0";
    if (host == "::1" || host == "[::1]") host = "127.0.0.1";
    auto& registry = metrics::Global();
    metrics::AddProcessMetrics(registry, program_invocation_short_name);
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> served =
        metrics::MetricsServer::Start(host, options_.metrics_port, &registry);
    if (!served.ok()) return served.status();
    metrics_ = std::move(*served);
    std::cout << program_invocation_short_name << " metrics on http://"
              << (metrics_->host() == "0.0.0.0" ? advertised_host_ : metrics_->host()) << ":" << metrics_->port()
              << "/metrics" << std::endl;
  }
  return absl::OkStatus();
}

std::string ServerRunner::address() const {
  std::string host = advertised_host_;
  if (host.empty()) {  // (not started)
    host = options_.host;
    if (host == "0.0.0.0") host = "127.0.0.1";
    if (host == "::" || host == "[::]") host = "::1";
  }
  return JoinHostPort(host, port_);
}

void ServerRunner::SetServing(bool serving) {
  if (server_ == nullptr) return;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(serving);
  }
}

void ServerRunner::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (wake_fds_[1] >= 0) {
    const char b = 0;
    (void)!write(wake_fds_[1], &b, 1);
  }
  if (server_ == nullptr) return;
  SetServing(false);
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options_.drain_timeout));
  server_->Wait();
}

int ServerRunner::WaitForTermination() {
  int signo = 0;
  if (InstallSignalHandlers().ok()) {
    pollfd fds[2] = {{g_signal_pipe[0], POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    for (;;) {
      const int n = poll(fds, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;
      if (fds[0].revents & POLLIN) {
        unsigned char b = 0;
        if (read(g_signal_pipe[0], &b, 1) == 1) signo = b;
        break;
      }
      if (fds[1].revents & POLLIN) break;
    }
  }
  Shutdown();
  return signo;
}

}  // namespace rlfleet::rpc

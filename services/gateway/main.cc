// rlfleet-gateway: OpenAI-compatible HTTP (/v1/completions, /v1/chat/completions,
// /v1/models) in front of the rollout replicas. Flags + wiring only.
#include <pthread.h>

#include <csignal>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "libs/common/config.h"
#include "libs/common/files.h"
#include "libs/http/http_server.h"
#include "libs/registry/registrar.h"
#include "libs/registry/registry_client.h"
#include "libs/rpc/client.h"
#include "services/gateway/gateway_core.h"
#include "services/gateway/rollout_pool.h"

ABSL_FLAG(std::string, http_host, "127.0.0.1", "IPv4 address the HTTP API listens on (0.0.0.0: every interface).");
ABSL_FLAG(int, http_port, 8000, "HTTP port of the API; 0 picks a free one (see --http_port_file).");
ABSL_FLAG(std::string, http_port_file, "", "Write the bound HTTP port to this file once serving.");
ABSL_FLAG(std::vector<std::string>, rollouts, {},
          "Rollout replicas (host:port, comma-separated). Empty: the admitted rollout replicas the controller at "
          "--registry_address lists.");
ABSL_FLAG(std::string, model_dir, "",
          "A Hugging Face model directory: its tokenizer.json (and chat template, for /v1/chat/completions) encode "
          "prompts and decode responses. Empty: the built-in tasks' tokenizer (prompts like \"reverse:123\").");
ABSL_FLAG(std::string, model_name, "",
          "The model name clients send and /v1/models lists. Empty: the --model_dir's last component, or "
          "\"rlfleet\".");
ABSL_FLAG(std::string, api_key_file, "",
          "File holding the API key clients must send (Authorization: Bearer KEY). Empty: none required.");
ABSL_FLAG(absl::Duration, request_timeout, absl::Minutes(5), "Deadline of one generation request.");
ABSL_FLAG(int, max_connections, 256,
          "HTTP connections served at once (a thread each); as many more are answered 503, then they wait.");
ABSL_FLAG(int, max_generations, 0,
          "Generation requests at once, all clients; past it 429. 0: --max_connections - 16 (room kept for /health "
          "and /v1/models).");
ABSL_FLAG(int, max_generations_per_client, 64,
          "Generation requests at once per API key (per client address without a key); past it 429.");
ABSL_FLAG(int, max_requests_per_minute_per_client, 6000,
          "Requests a minute per API key (per client address without a key), bursts up to that; past it 429. 0: no "
          "bound.");
ABSL_FLAG(bool, insecure, false,
          "Serve on a non-loopback --http_host without --api_key_file (anyone who reaches the port may generate).");

int main(int argc, char** argv) {
  rlfleet::common::ParseFlagsWithConfig(argc, argv,
                                        "rlfleet-gateway: OpenAI-compatible HTTP for the rollout replicas.");
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  rlfleet::gateway::GatewayOptions gateway;
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  gateway.model_name = absl::GetFlag(FLAGS_model_name);
  if (gateway.model_name.empty()) {
    const std::string dir(absl::StripSuffix(model_dir, "/"));
    gateway.model_name = dir.empty() ? "rlfleet" : dir.substr(dir.find_last_of('/') + 1);
  }
  gateway.request_timeout = absl::GetFlag(FLAGS_request_timeout);
  if (const std::string file = absl::GetFlag(FLAGS_api_key_file); !file.empty()) {
    absl::StatusOr<std::string> key = rlfleet::common::ReadRegularFile("--api_key_file", file, 4096);
    if (!key.ok()) {
      std::cerr << "rlfleet-gateway: --api_key_file: " << key.status() << "\n";
      return 2;
    }
    gateway.api_key = std::string(absl::StripAsciiWhitespace(*key));
    if (gateway.api_key.empty()) {
      std::cerr << "rlfleet-gateway: --api_key_file " << file << " is empty\n";
      return 2;
    }
  }
  const std::string http_host = absl::GetFlag(FLAGS_http_host);
  const int max_connections = absl::GetFlag(FLAGS_max_connections);
  gateway.max_generations = absl::GetFlag(FLAGS_max_generations);
  gateway.max_generations_per_client = absl::GetFlag(FLAGS_max_generations_per_client);
  gateway.max_requests_per_minute_per_client = absl::GetFlag(FLAGS_max_requests_per_minute_per_client);
  if (absl::Status s =
          rlfleet::gateway::CompleteOptions(http_host, max_connections, absl::GetFlag(FLAGS_insecure), &gateway);
      !s.ok()) {
    std::cerr << "rlfleet-gateway: " << s.message() << "\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<rlfleet::gateway::TextCodec>> codec =
      model_dir.empty() ? rlfleet::gateway::BuiltinCodec() : rlfleet::gateway::ModelDirCodec(model_dir);
  if (!codec.ok()) {
    std::cerr << "rlfleet-gateway: --model_dir: " << codec.status() << "\n";
    return 2;
  }

  const std::vector<std::string> fixed = absl::GetFlag(FLAGS_rollouts);
  const std::string registry_address = rlfleet::registry::RegistryAddressFromFlags();
  if (fixed.empty() == registry_address.empty()) {
    std::cerr << "rlfleet-gateway: give either --rollouts (replica addresses) or --registry_address (the controller "
                 "that lists them), not both or neither\n";
    return 2;
  }
  auto client = rlfleet::rpc::ClientOptionsFromFlags(registry_address);
  if (!client.ok()) {
    std::cerr << "rlfleet-gateway: " << client.status() << "\n";
    return 2;
  }
  std::unique_ptr<rlfleet::registry::RegistryClient> registry;
  if (!registry_address.empty()) {
    auto connected = rlfleet::registry::RegistryClient::Connect(*client);
    if (!connected.ok()) {
      std::cerr << "rlfleet-gateway: --registry_address: " << connected.status() << "\n";
      return 2;
    }
    registry = *std::move(connected);
  }
  rlfleet::gateway::RolloutPool pool(fixed, std::move(registry), *client);
  rlfleet::gateway::Gateway core(gateway, *std::move(codec), &pool);
  rlfleet::http::Server::Options http;
  http.max_connections = max_connections;
  http.paths = rlfleet::gateway::GatewayPaths();
  http.read_timeout = absl::Seconds(15);
  auto server = rlfleet::http::Server::Start(
      http_host, absl::GetFlag(FLAGS_http_port), http,
      [&core](const rlfleet::http::Request& r) { return core.Handle(r); },
      [&core](const rlfleet::http::Request& r) { return core.CheckHead(r); });
  if (!server.ok()) {
    std::cerr << "rlfleet-gateway: " << server.status() << "\n";
    return 1;
  }
  if (const std::string file = absl::GetFlag(FLAGS_http_port_file); !file.empty()) {
    if (absl::Status s = rlfleet::common::WritePortFile(file, (*server)->port()); !s.ok()) {
      std::cerr << "rlfleet-gateway: --http_port_file: " << s << "\n";
      return 1;
    }
  }
  std::cout << "rlfleet-gateway: OpenAI-compatible API on http://" << http_host << ":" << (*server)->port()
            << "/v1 (model \"" << gateway.model_name << "\"" << (gateway.api_key.empty() ? "" : ", API key required")
            << "), replicas "
            << (fixed.empty() ? "from the registry at " + registry_address : absl::StrJoin(fixed, ", ")) << std::endl;

  // (blocked before any thread starts, so that every thread inherits the mask)
  int signo = 0;
  sigwait(&stop_signals, &signo);
  std::cout << "rlfleet-gateway: stopping on signal " << signo << std::endl;
  pool.Shutdown();  // (ends the handlers' generations, so that the server can stop)
  server->reset();
  std::cout << "rlfleet-gateway stopped" << std::endl;
  return 0;
}

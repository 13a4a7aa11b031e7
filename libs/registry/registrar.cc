#include "libs/registry/registrar.h"

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "libs/common/ids.h"
#include "libs/common/status_macros.h"
#include "libs/registry/load.h"

extern char** environ;

ABSL_FLAG(std::string, registry_address, "",
          "The controller (RegistryService) to register with, so that runs discover this service; "
          "empty: not registered.");

namespace rlfleet::registry {

std::map<std::string, std::string> NcclEnvLabels(const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> labels;
  for (const auto& [name, value] : env) {
    if (name.rfind("NCCL_", 0) != 0) continue;
    if (labels.size() == 24) break;
    labels["env." + name] = value;
  }
  return labels;
}

std::map<std::string, std::string> ProcessEnv() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

absl::StatusOr<std::unique_ptr<Registrar>> Registrar::Start(Options options, Fill fill, Log log, Rejoined rejoined) {
  if (options.replica.replica_id().empty()) {
    std::string role = v1::ReplicaRole_Name(options.replica.role());  // REPLICA_ROLE_ROLLOUT -> rollout
    if (role.rfind("REPLICA_ROLE_", 0) == 0) role = role.substr(13);
    options.replica.set_replica_id(common::NewId(absl::AsciiStrToLower(role)));
  }
  for (const auto& [key, value] : NcclEnvLabels(ProcessEnv())) (*options.replica.mutable_labels())[key] = value;
  if (options.replica.started_at_unix_ms() == 0) {
    options.replica.set_started_at_unix_ms(absl::ToUnixMillis(absl::Now()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RegistryClient> client, RegistryClient::Connect(options.client));
  std::unique_ptr<Registrar> r(
      new Registrar(std::move(options), std::move(fill), std::move(log), std::move(rejoined), std::move(client)));
  RETURN_IF_ERROR(r->RegisterNow());
  r->thread_ = std::thread([p = r.get()] { p->Loop(); });
  return r;
}

Registrar::Registrar(Options options, Fill fill, Log log, Rejoined rejoined, std::unique_ptr<RegistryClient> client)
    : options_(std::move(options)),
      fill_(std::move(fill)),
      log_(std::move(log)),
      rejoined_(std::move(rejoined)),
      client_(std::move(client)) {}

Registrar::~Registrar() {
  std::string lease;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    lease = lease_id_;
  }
  if (thread_.joinable()) thread_.join();
  if (lease.empty()) return;
  v1::DeregisterRequest request;
  request.set_replica_id(options_.replica.replica_id());
  request.set_lease_id(lease);
  (void)client_->Deregister(request, absl::Seconds(2));
}

bool Registrar::admitted() {
  absl::MutexLock lock(&mu_);
  return admitted_;
}

int Registrar::rejoins() {
  absl::MutexLock lock(&mu_);
  return rejoins_;
}

absl::Status Registrar::RegisterNow() {
  v1::RegisterRequest request;
  *request.mutable_replica() = options_.replica;
  if (fill_) fill_(request.mutable_replica());
  ClampLoad(request.mutable_replica()->mutable_load());
  request.set_ttl_ms(absl::ToInt64Milliseconds(options_.ttl));
  ASSIGN_OR_RETURN(const v1::RegisterResponse response, client_->Register(request));
  absl::MutexLock lock(&mu_);
  lease_id_ = response.lease_id();
  interval_ = absl::Milliseconds(std::max<int64_t>(100, response.heartbeat_interval_ms()));
  admitted_ = response.replica().admitted();
  return absl::OkStatus();
}

void Registrar::Loop() {
  for (;;) {
    std::string lease;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), interval_)) return;
      lease = lease_id_;
    }
    v1::ReplicaInfo now = options_.replica;
    if (fill_) fill_(&now);
    v1::HeartbeatRequest request;
    request.set_replica_id(now.replica_id());
    request.set_lease_id(lease);
    *request.mutable_load() = now.load();
    ClampLoad(request.mutable_load());
    *request.mutable_policy_version() = now.policy_version();
    absl::StatusOr<v1::HeartbeatResponse> response = client_->Heartbeat(request);
    absl::Status s = response.status();
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      admitted_ = response->admitted();
      continue;
    }
    // NOT_FOUND: the registry forgot the lease (it expired, e.g. while its Redis was
    // down, or the registry restarted): register again under a new lease. The
    // controller drained the replica when the old lease expired; `rejoined_` lets it
    // take work again.
    if (absl::IsNotFound(s)) {
      s = RegisterNow();
      if (s.ok()) {
        {
          absl::MutexLock lock(&mu_);
          ++rejoins_;
        }
        if (log_) log_(absl::StrCat("registry ", options_.client.target, ": the lease was lost; registered again"));
        if (rejoined_) rejoined_();
        continue;
      }
    }
    if (!s.ok() && log_) log_(absl::StrCat("registry ", options_.client.target, ": ", s.message(), " (retrying)"));
  }
}

std::string RegistryAddressFromFlags() { return absl::GetFlag(FLAGS_registry_address); }

absl::StatusOr<std::unique_ptr<Registrar>> RegisterFromFlags(v1::ReplicaRole role, const std::string& grpc_address,
                                                             int metrics_port, Registrar::Fill fill,
                                                             const std::string& name, Registrar::Rejoined rejoined,
                                                             const std::map<std::string, std::string>& labels) {
  const std::string address = RegistryAddressFromFlags();
  if (address.empty()) return std::unique_ptr<Registrar>();
  auto client = rpc::ClientOptionsFromFlags(address);
  if (!client.ok()) return common::Annotate(client.status(), "--registry_address");
  Registrar::Options o;
  o.client = *client;
  o.replica.set_role(role);
  o.replica.set_grpc_address(grpc_address);
  if (metrics_port > 0) (*o.replica.mutable_labels())["metrics_port"] = std::to_string(metrics_port);
  for (const auto& [key, value] : labels) (*o.replica.mutable_labels())[key] = value;
  auto started = Registrar::Start(
      o, std::move(fill), [name](const std::string& line) { std::cerr << name << ": " << line << std::endl; },
      std::move(rejoined));
  if (!started.ok()) return common::Annotate(started.status(), absl::StrCat("registering with ", address));
  std::cout << name << " registered as " << (*started)->replica_id() << std::endl;
  return started;
}

}  // namespace rlfleet::registry

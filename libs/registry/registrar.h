// Registrar: keeps one replica registered with a RegistryService (the controller) over
// gRPC: Register, then a heartbeat every TTL/3 carrying what `fill` reports (policy
// version, load); a lease the registry no longer knows (it expired, e.g. while the
// registry's Redis was down, or the registry restarted) is registered again under a new
// lease, and `rejoined` is told: the controller drains a replica whose lease expired,
// so a replica that wants work again resumes there. The destructor deregisters.
// Failures are retried and told to `log`, never fatal: a replica keeps serving while
// the registry is away.
#ifndef RLFLEET_LIBS_REGISTRY_REGISTRAR_H_
#define RLFLEET_LIBS_REGISTRY_REGISTRAR_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/registry/registry_client.h"
#include "libs/rpc/client.h"
#include "rlfleet/v1/controller.grpc.pb.h"

namespace rlfleet::registry {

// The NCCL_* variables of `env` as registry labels "env.NCCL_X" (at most 24, by
// name): `rlfleet doctor --fleet` compares them across replicas.
std::map<std::string, std::string> NcclEnvLabels(const std::map<std::string, std::string>& env);
// This process's environment as a map.
std::map<std::string, std::string> ProcessEnv();

class Registrar {
 public:
  struct Options {
    rpc::ClientOptions client;  // target: the RegistryService's address
    v1::ReplicaInfo replica;    // role, grpc_address, labels; replica_id set if empty
    absl::Duration ttl = absl::Seconds(10);
  };
  // Reports the replica's current state before each heartbeat (and registration).
  using Fill = std::function<void(v1::ReplicaInfo* replica)>;
  using Log = std::function<void(const std::string&)>;
  // Called on the heartbeat thread each time the replica registered again under a new
  // lease because the registry had lost the old one (never for the first registration).
  using Rejoined = std::function<void()>;

  // Registers once (so the caller learns at start-up whether the registry answers:
  // the error is returned) and starts heartbeating. The process's NCCL_* variables
  // are added to the labels (NcclEnvLabels).
  static absl::StatusOr<std::unique_ptr<Registrar>> Start(Options options, Fill fill, Log log,
                                                          Rejoined rejoined = nullptr);
  ~Registrar();  // deregisters (best effort, 2 s)

  const std::string& replica_id() const { return options_.replica.replica_id(); }
  bool admitted();  // as the registry said at the last heartbeat
  int rejoins();    // how many times the registrar registered again under a new lease

 private:
  Registrar(Options options, Fill fill, Log log, Rejoined rejoined, std::unique_ptr<RegistryClient> client);
  absl::Status RegisterNow();
  void Loop();

  Options options_;
  const Fill fill_;
  const Log log_;
  const Rejoined rejoined_;
  const std::unique_ptr<RegistryClient> client_;
  absl::Mutex mu_;
  std::string lease_id_ ABSL_GUARDED_BY(mu_);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_);
  bool admitted_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int rejoins_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

// What every service's main does with its --registry_address flag (defined with this
// library: "the controller to register with, so that runs discover this service"):
// nothing when it is empty (returns nullptr), else Registrar::Start as `role` at
// `grpc_address` with the label metrics_port (when > 0), logging as `name`; `rejoined`
// as for Registrar::Start (a rollout replica resumes there).
// The value of --registry_address (empty: the service registers nowhere).
std::string RegistryAddressFromFlags();

absl::StatusOr<std::unique_ptr<Registrar>> RegisterFromFlags(v1::ReplicaRole role, const std::string& grpc_address,
                                                             int metrics_port, Registrar::Fill fill,
                                                             const std::string& name,
                                                             Registrar::Rejoined rejoined = nullptr,
                                                             const std::map<std::string, std::string>& labels = {});

}  // namespace rlfleet::registry

#endif  // RLFLEET_LIBS_REGISTRY_REGISTRAR_H_

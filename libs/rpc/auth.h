// Authentication for rlfleet's gRPC services: a bearer token checked on every call,
// and TLS / mutual TLS from certificate files. Both are off by default (the local demo
// runs on loopback) and turned on by flags shared by every binary:
//
//   --auth_token=SECRET or --auth_token_file=PATH   bearer token (server checks, client sends)
//   --tls_cert=PEM --tls_key=PEM                     this side's certificate chain and key
//   --tls_ca=PEM                                     CA that signs the peer's certificate
//   --tls_require_client_cert                        server: mutual TLS
//
// A call without the right token gets UNAUTHENTICATED. The standard health service
// (grpc.health.v1) answers without a token so that orchestrators' probes work.
//
// Roles. Most RPCs are fleet RPCs: any fleet member (the bearer token) may call them.
// Controller-only RPCs (StartRun, StopRun, Scale; the trainer's SaveCheckpoint and
// LoadCheckpoint, which name paths) also need the controller role, proven by either
//   --admin_token=SECRET or --admin_token_file=PATH   a second bearer token, or
//   --admin_identities=NAME[,NAME]                     a verified client certificate
//                                                      whose common name or SAN is listed
// Clients that hold the admin token (the controller, the rlfleet CLI) send it instead of
// the fleet token; it grants fleet RPCs too. Without any of these flags the fleet token
// grants every RPC (a single trust domain, as before roles existed).
//
// Inference RPCs (rollout's Generate; the registry's ListReplicas and WatchReplicas,
// which read the replicas' addresses) are also open to
//   --inference_token=SECRET or --inference_token_file=PATH   a third bearer token
// that grants nothing else (PERMISSION_DENIED naming the RPC): the OpenAI gateway's
// credential, so that a gateway exposed to clients cannot train, publish weights, score
// or run. The gateway presents it as its --auth_token_file; servers that hold it accept
// it; no client sends it in place of its own token.
#ifndef RLFLEET_LIBS_RPC_AUTH_H_
#define RLFLEET_LIBS_RPC_AUTH_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

ABSL_DECLARE_FLAG(std::string, auth_token);
ABSL_DECLARE_FLAG(std::string, auth_token_file);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(bool, tls_require_client_cert);
ABSL_DECLARE_FLAG(std::string, admin_token);
ABSL_DECLARE_FLAG(std::string, admin_token_file);
ABSL_DECLARE_FLAG(std::vector<std::string>, admin_identities);
ABSL_DECLARE_FLAG(std::string, inference_token);
ABSL_DECLARE_FLAG(std::string, inference_token_file);

namespace rlfleet::rpc {

// Metadata key that carries "Bearer <token>".
inline constexpr char kAuthorizationKey[] = "authorization";

struct AuthOptions {
  // Bearer token; empty disables token auth.
  std::string token;
  // PEM file paths. Server: cert + key enable TLS; ca + require_client_cert make it
  // mutual. Client: ca enables TLS (server verified against it); cert + key present a
  // client certificate.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  bool require_client_cert = false;
  // Client only: expected server name in its certificate (default: the target host).
  std::string tls_server_name;
  // Controller role: bearer token (servers check it on controller-only RPCs; clients
  // send it instead of `token` when set). Empty: no admin token.
  std::string admin_token;
  // Servers: verified client-certificate names (CN or SAN) that hold the controller role.
  std::vector<std::string> admin_identities;
  // Servers: a bearer token that grants Role::kInference RPCs only. Empty: none.
  std::string inference_token;

  bool tls_enabled_for_server() const { return !tls_cert_file.empty(); }
  bool tls_enabled_for_client() const { return !tls_ca_file.empty(); }
};

// Reads the auth flags. INVALID_ARGUMENT if both --auth_token and --auth_token_file
// (or --admin_token and --admin_token_file, or the inference pair) are set, or if any two
// of the fleet, admin and inference tokens are equal; NOT_FOUND if a token file cannot be read, INVALID_ARGUMENT if it
// is empty.
absl::StatusOr<AuthOptions> AuthOptionsFromFlags();

// Server credentials for `options`: insecure, TLS, or mutual TLS. NOT_FOUND naming the
// file when a PEM file cannot be read; INVALID_ARGUMENT for inconsistent options
// (a key without a cert, require_client_cert without a CA).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const AuthOptions& options);

// Channel credentials for `options` (insecure or TLS, with a client certificate when
// given). Errors as for MakeServerCredentials.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const AuthOptions& options);

// Checks a server call's bearer token in constant time. OK when `expected_token` is
// empty (auth off); UNAUTHENTICATED, saying what was wrong, otherwise.
absl::Status CheckBearerToken(const grpc::ServerContextBase& context, const std::string& expected_token);

// Who may call an RPC.
enum class Role {
  kFleet,       // any fleet member
  kController,  // the controller (admin token or admin identity)
  kInference,   // any fleet member, or the inference token (Generate, reading the registry)
};

// What every handler needs to authorise a call. Copyable; immutable after start.
struct CallAuth {
  std::string token;                          // fleet bearer token; empty: fleet RPCs need no token
  std::string admin_token;                    // controller role's bearer token; empty: none
  std::vector<std::string> admin_identities;  // controller role's certificate names
  std::string inference_token;                // grants kInference RPCs only; empty: none

  // True when controller-only RPCs need more than the fleet check.
  bool roles_enabled() const { return !admin_token.empty() || !admin_identities.empty(); }
};

// The server-side part of `options`.
CallAuth CallAuthFrom(const AuthOptions& options);

// Authorises a call to `method` for `role`. Fleet: OK with no tokens configured, or the
// fleet or admin bearer token (UNAUTHENTICATED otherwise). Controller: when roles are
// enabled, the admin bearer token or a verified client certificate named in
// admin_identities (PERMISSION_DENIED naming `method` otherwise); when not, as fleet.
// Inference: as fleet, or the inference token. The inference token on a fleet or
// controller RPC: PERMISSION_DENIED naming `method`.
absl::Status Authorize(const grpc::ServerContextBase& context, const CallAuth& auth, Role role,
                       absl::string_view method);

// Reads a whole (small) file. NOT_FOUND naming it when it cannot be opened.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path);

}  // namespace rlfleet::rpc

#endif  // RLFLEET_LIBS_RPC_AUTH_H_

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
#ifndef RLFLEET_LIBS_RPC_AUTH_H_
#define RLFLEET_LIBS_RPC_AUTH_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

ABSL_DECLARE_FLAG(std::string, auth_token);
ABSL_DECLARE_FLAG(std::string, auth_token_file);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(bool, tls_require_client_cert);

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

  bool tls_enabled_for_server() const { return !tls_cert_file.empty(); }
  bool tls_enabled_for_client() const { return !tls_ca_file.empty(); }
};

// Reads the auth flags. INVALID_ARGUMENT if both --auth_token and --auth_token_file
// are set, NOT_FOUND if the token file cannot be read, INVALID_ARGUMENT if it is empty.
absl::StatusOr<AuthOptions> AuthOptionsFromFlags();

// Server credentials for `options`: insecure, TLS, or mutual TLS. NOT_FOUND naming the
// file when a PEM file cannot be read; INVALID_ARGUMENT for inconsistent options
// (a key without a cert, require_client_cert without a CA).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const AuthOptions& options);

// Channel credentials for `options` (insecure or TLS, with a client certificate when
// given). Errors as for MakeServerCredentials.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const AuthOptions& options);

// Checks a server call's bearer token in constant time. OK when `expected_token` is
// empty (auth off); UNAUTHENTICATED, saying what was wrong, otherwise.
absl::Status CheckBearerToken(const grpc::ServerContextBase& context,
                              const std::string& expected_token);

// Reads a whole (small) file. NOT_FOUND naming it when it cannot be opened.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path);

}  // namespace rlfleet::rpc

#endif  // RLFLEET_LIBS_RPC_AUTH_H_

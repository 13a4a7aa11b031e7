#include "libs/rpc/auth.h"

#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "libs/common/hmac.h"
#include "libs/common/status_macros.h"

ABSL_FLAG(std::string, auth_token, "", "Bearer token: servers require it on every call, clients send it. Empty: off.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the bearer token (preferred over "
          "--auth_token, which shows in `ps`).");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of this side; enables TLS on servers.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle that signs the peer's certificate; enables TLS on clients.");
ABSL_FLAG(bool, tls_require_client_cert, false, "Servers: require and verify a client certificate (mutual TLS).");

ABSL_FLAG(std::string, admin_token, "",
          "Controller role's bearer token: servers require it on controller-only RPCs; the controller "
          "and the rlfleet CLI send it. Empty: the fleet token grants every RPC.");
ABSL_FLAG(std::string, admin_token_file, "", "File holding --admin_token (preferred: not shown in `ps`).");
ABSL_FLAG(std::vector<std::string>, admin_identities, {},
          "Servers: client-certificate names (CN or SAN, verified by mutual TLS) that hold the controller role.");
ABSL_FLAG(std::string, inference_token, "",
          "Servers: a bearer token that grants only Generate, ListReplicas and WatchReplicas (the "
          "OpenAI gateway's credential; the gateway sends it as its --auth_token). Empty: none.");
ABSL_FLAG(std::string, inference_token_file, "", "File holding --inference_token (preferred: not shown in `ps`).");

namespace rlfleet::rpc {
namespace {

constexpr size_t kMaxPemBytes = 1 << 20;

using common::ConstantTimeEquals;

// Reads a token given inline or in a file (not both); `name` is the flag's name.
absl::StatusOr<std::string> TokenFromFlags(const std::string& inline_value, const std::string& file,
                                           absl::string_view name) {
  if (file.empty()) return inline_value;
  if (!inline_value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("set --", name, " or --", name, "_file, not both"));
  }
  ASSIGN_OR_RETURN(std::string token, ReadSmallFile(file));
  token = std::string(absl::StripAsciiWhitespace(token));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("--", name, "_file ", file, " is empty"));
  return token;
}

// The bearer token a call carries, or empty.
absl::string_view BearerOf(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationKey);
  if (it == metadata.end()) return {};
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ")) return {};
  return value;
}

// True if the call's verified client certificate names one of `identities`.
bool PeerHasIdentity(const grpc::ServerContextBase& context, const std::vector<std::string>& identities) {
  if (identities.empty()) return false;
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return false;
  for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
    for (const grpc::string_ref& name : auth->FindPropertyValues(property)) {
      for (const std::string& want : identities) {
        if (absl::string_view(name.data(), name.size()) == want) return true;
      }
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string data(kMaxPemBytes + 1, '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<size_t>(in.gcount()));
  if (data.size() > kMaxPemBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is larger than ", kMaxPemBytes, " bytes"));
  }
  return data;
}

absl::StatusOr<AuthOptions> AuthOptionsFromFlags() {
  AuthOptions options;
  ASSIGN_OR_RETURN(options.token,
                   TokenFromFlags(absl::GetFlag(FLAGS_auth_token), absl::GetFlag(FLAGS_auth_token_file), "auth_token"));
  ASSIGN_OR_RETURN(options.admin_token, TokenFromFlags(absl::GetFlag(FLAGS_admin_token),
                                                       absl::GetFlag(FLAGS_admin_token_file), "admin_token"));
  if (!options.admin_token.empty() && options.admin_token == options.token) {
    return absl::InvalidArgumentError("--admin_token must differ from --auth_token (it is a separate role)");
  }
  ASSIGN_OR_RETURN(options.inference_token,
                   TokenFromFlags(absl::GetFlag(FLAGS_inference_token), absl::GetFlag(FLAGS_inference_token_file),
                                  "inference_token"));
  if (!options.inference_token.empty() &&
      (options.inference_token == options.token || options.inference_token == options.admin_token)) {
    return absl::InvalidArgumentError(
        "--inference_token must differ from --auth_token and --admin_token (it is a separate role)");
  }
  options.admin_identities = absl::GetFlag(FLAGS_admin_identities);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  return options;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const AuthOptions& options) {
  if (!options.tls_enabled_for_server()) {
    if (!options.tls_key_file.empty() || options.require_client_cert) {
      return absl::InvalidArgumentError("--tls_key / --tls_require_client_cert need --tls_cert on a server");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert needs --tls_key on a server");
  }
  if (options.require_client_cert && options.tls_ca_file.empty()) {
    return absl::InvalidArgumentError("--tls_require_client_cert needs --tls_ca to verify client certificates");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadSmallFile(options.tls_cert_file));
  ASSIGN_OR_RETURN(pair.private_key, ReadSmallFile(options.tls_key_file));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (options.require_client_cert) {
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  if (!options.tls_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadSmallFile(options.tls_ca_file));
  }
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const AuthOptions& options) {
  if (!options.tls_enabled_for_client()) {
    if (!options.tls_cert_file.empty()) {
      return absl::InvalidArgumentError("a client certificate (--tls_cert) needs --tls_ca");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadSmallFile(options.tls_ca_file));
  if (!options.tls_cert_file.empty()) {
    if (options.tls_key_file.empty()) {
      return absl::InvalidArgumentError("--tls_cert needs --tls_key");
    }
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadSmallFile(options.tls_cert_file));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadSmallFile(options.tls_key_file));
  }
  return grpc::SslCredentials(ssl);
}

CallAuth CallAuthFrom(const AuthOptions& options) {
  return CallAuth{options.token, options.admin_token, options.admin_identities, options.inference_token};
}

absl::Status Authorize(const grpc::ServerContextBase& context, const CallAuth& auth, Role role,
                       absl::string_view method) {
  if (!auth.inference_token.empty() && ConstantTimeEquals(BearerOf(context), auth.inference_token)) {
    if (role == Role::kInference) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        method, " is not open to the inference token (it grants Generate, ListReplicas and WatchReplicas only)"));
  }
  if (role == Role::kController && auth.roles_enabled()) {
    const absl::string_view bearer = BearerOf(context);
    if (!auth.admin_token.empty() && ConstantTimeEquals(bearer, auth.admin_token)) return absl::OkStatus();
    if (PeerHasIdentity(context, auth.admin_identities)) return CheckBearerToken(context, auth.token);
    return absl::PermissionDeniedError(
        absl::StrCat(method,
                     " is a controller-only RPC: present the admin token (--admin_token_file) or a "
                     "client certificate named in the server's --admin_identities"));
  }
  if (!auth.admin_token.empty() && ConstantTimeEquals(BearerOf(context), auth.admin_token)) {
    return absl::OkStatus();
  }
  return CheckBearerToken(context, auth.token);
}

absl::Status CheckBearerToken(const grpc::ServerContextBase& context, const std::string& expected_token) {
  if (expected_token.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationKey);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("missing `authorization: Bearer <token>` metadata");
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ")) {
    return absl::UnauthenticatedError("authorization metadata is not a Bearer token");
  }
  if (!ConstantTimeEquals(value, expected_token)) {
    return absl::UnauthenticatedError("wrong bearer token");
  }
  return absl::OkStatus();
}

}  // namespace rlfleet::rpc

// Small pieces shared by the rlfleet CLI's commands.
#ifndef RLFLEET_SERVICES_CONTROLLER_CLI_UTIL_H_
#define RLFLEET_SERVICES_CONTROLLER_CLI_UTIL_H_

#include <grpcpp/client_context.h>

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "libs/rpc/client.h"

namespace rlfleet::controller {

// A context with a deadline `timeout` from now and the bearer token of `options`.
inline std::unique_ptr<grpc::ClientContext> CallContext(const rpc::ClientOptions& options,
                                                        absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!options.auth.token.empty()) context->AddMetadata(rpc::kAuthorizationKey, "Bearer " + options.auth.token);
  return context;
}

// Prints "rlfleet: <what>: <message>" and returns the exit code 1.
inline int ReportRpcError(const grpc::Status& status, absl::string_view what) {
  std::cerr << "rlfleet: " << what << ": " << status.error_message() << "\n";
  return 1;
}

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_CLI_UTIL_H_

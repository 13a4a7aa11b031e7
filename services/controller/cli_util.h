// Small pieces shared by the rlfleet CLI's commands.
#ifndef RLFLEET_SERVICES_CONTROLLER_CLI_UTIL_H_
#define RLFLEET_SERVICES_CONTROLLER_CLI_UTIL_H_

#include <grpcpp/support/status.h>

#include <iostream>
#include <string>

#include "absl/strings/string_view.h"

namespace rlfleet::controller {

// Prints "rlfleet: <what>: <message>" and returns the exit code 1.
inline int ReportRpcError(const grpc::Status& status, absl::string_view what) {
  std::cerr << "rlfleet: " << what << ": " << status.error_message() << "\n";
  return 1;
}

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_CLI_UTIL_H_

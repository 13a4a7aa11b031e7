// The one place where absl::Status and grpc::Status are converted. The codes map 1:1
// (absl::StatusCode mirrors grpc::StatusCode); messages are kept.
#ifndef RLFLEET_LIBS_RPC_STATUS_CONVERSION_H_
#define RLFLEET_LIBS_RPC_STATUS_CONVERSION_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace rlfleet::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status ToAbslStatus(const grpc::Status& status);

}  // namespace rlfleet::rpc

#endif  // RLFLEET_LIBS_RPC_STATUS_CONVERSION_H_

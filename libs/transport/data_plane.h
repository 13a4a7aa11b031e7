// The data plane a service opens from its --data_plane flag (defined with this
// library): "ucx" (the default; UCX on the loopback interface only when the service
// serves on a loopback host, on every interface otherwise) or "none"; with
// --data_plane_devices / --data_plane_tls choosing UCX's devices and transports and
// --data_plane_secret_file wrapping it in an AuthenticatedTransport (signed descriptors).
#ifndef RLFLEET_LIBS_TRANSPORT_DATA_PLANE_H_
#define RLFLEET_LIBS_TRANSPORT_DATA_PLANE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libs/transport/transport.h"

namespace rlfleet::transport {

// The fleet's data-plane secret from --data_plane_secret_file: empty when unset;
// NOT_FOUND / INVALID_ARGUMENT for a missing, non-regular or too short file.
absl::StatusOr<std::string> DataPlaneSecretFromFlags();

// The transport --data_plane asks for, for a service serving on `serving_host`:
// nullptr for "none", and also when UCX cannot start (said on stderr as "`name`: no
// UCX data plane (why); `without`"). INVALID_ARGUMENT for another flag value; an error
// too when devices or transports the flags chose cannot start, or the secret file is bad.
absl::StatusOr<std::unique_ptr<Transport>> OpenDataPlaneFromFlags(const std::string& serving_host,
                                                                  const std::string& name, const std::string& without);

}  // namespace rlfleet::transport

#endif  // RLFLEET_LIBS_TRANSPORT_DATA_PLANE_H_

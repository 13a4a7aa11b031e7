// The data plane a service opens from its --data_plane flag (defined with this
// library): "ucx" (the default; UCX on the loopback interface only when the service
// serves on a loopback host, on every interface otherwise) or "none".
#ifndef RLFLEET_LIBS_TRANSPORT_DATA_PLANE_H_
#define RLFLEET_LIBS_TRANSPORT_DATA_PLANE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libs/transport/transport.h"

namespace rlfleet::transport {

// Whether `host` names this machine's loopback (127.x.y.z, ::1, localhost).
bool IsLoopbackHost(const std::string& host);

// The transport --data_plane asks for, for a service serving on `serving_host`:
// nullptr for "none", and also when UCX cannot start (said on stderr as "`name`: no
// UCX data plane (why); `without`"). INVALID_ARGUMENT for another flag value.
absl::StatusOr<std::unique_ptr<Transport>> OpenDataPlaneFromFlags(const std::string& serving_host,
                                                                 const std::string& name, const std::string& without);

}  // namespace rlfleet::transport

#endif  // RLFLEET_LIBS_TRANSPORT_DATA_PLANE_H_

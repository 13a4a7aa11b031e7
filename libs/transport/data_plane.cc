#include "libs/transport/data_plane.h"

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "libs/transport/ucx/ucx_transport.h"

ABSL_FLAG(std::string, data_plane, "ucx",
          "How this service moves bulk bytes sent by descriptor (experience payloads, weight versions): ucx, or "
          "none (FILE descriptors only).");

namespace rlfleet::transport {

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

absl::StatusOr<std::unique_ptr<Transport>> OpenDataPlaneFromFlags(const std::string& serving_host,
                                                                 const std::string& name,
                                                                 const std::string& without) {
  const std::string kind = absl::GetFlag(FLAGS_data_plane);
  if (kind == "none") return std::unique_ptr<Transport>();
  if (kind != "ucx") return absl::InvalidArgumentError(absl::StrCat("--data_plane=", kind, ": want ucx or none"));
  UcxOptions ucx;
  ucx.loopback_only = IsLoopbackHost(serving_host);
  absl::StatusOr<std::unique_ptr<UcxTransport>> t = UcxTransport::Create(ucx);
  if (!t.ok()) {
    std::cerr << name << ": no UCX data plane (" << t.status() << "); " << without << std::endl;
    return std::unique_ptr<Transport>();
  }
  return std::unique_ptr<Transport>(std::move(*t));
}

}  // namespace rlfleet::transport

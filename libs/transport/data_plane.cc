#include "libs/transport/data_plane.h"

#include <filesystem>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/common/files.h"
#include "libs/common/hosts.h"
#include "libs/transport/authenticated/authenticated_transport.h"
#include "libs/transport/ucx/ucx_transport.h"

ABSL_FLAG(std::string, data_plane, "ucx",
          "How this service moves bulk bytes sent by descriptor (experience payloads, weight versions): ucx, or "
          "none (FILE descriptors only).");

ABSL_FLAG(std::string, data_plane_secret_file, "",
          "File holding the fleet's data-plane secret (at least 16 bytes; every service of the fleet the same): "
          "memory descriptors are then signed with it and only signed ones are used. Empty: off.");
ABSL_FLAG(std::string, data_plane_devices, "",
          "Network devices the UCX data plane uses (UCX_NET_DEVICES syntax, e.g. eth1): it listens and connects "
          "only there. Empty: lo when serving on loopback, else UCX_NET_DEVICES or all.");
ABSL_FLAG(std::string, data_plane_tls, "",
          "UCX transports (UCX_TLS syntax: tcp, sm, rc, dc, ud, ...). Empty: UCX_TLS or UCX's default.");

namespace rlfleet::transport {

namespace {

// UCX only warns about a device that does not exist and starts without it (no network
// lane at all): check each of a comma-separated list against sysfs first.
absl::Status CheckNetDevicesExist(const std::string& devices) {
  for (absl::string_view device : absl::StrSplit(devices, ',', absl::SkipEmpty())) {
    const absl::string_view name = device.substr(0, device.find(':'));  // "mlx5_0:1" -> "mlx5_0"
    if (name == "all") continue;
    if (name.find('/') != absl::string_view::npos || name == "." || name == ".." ||
        (!std::filesystem::exists(absl::StrCat("/sys/class/net/", name)) &&
         !std::filesystem::exists(absl::StrCat("/sys/class/infiniband/", name)))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--data_plane_devices: no network device \"", name, "\" on this host"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> DataPlaneSecretFromFlags() {
  const std::string file = absl::GetFlag(FLAGS_data_plane_secret_file);
  if (file.empty()) return std::string();
  absl::StatusOr<std::string> secret = common::ReadRegularFile("--data_plane_secret_file", file, 4096);
  if (!secret.ok()) return secret.status();
  while (!secret->empty() && (secret->back() == '\n' || secret->back() == '\r')) secret->pop_back();
  if (secret->size() < kMinDataPlaneSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--data_plane_secret_file ", file, " holds ", secret->size(),
                                                   " bytes; at least ", kMinDataPlaneSecretBytes, " are needed"));
  }
  return secret;
}

absl::StatusOr<std::unique_ptr<Transport>> OpenDataPlaneFromFlags(const std::string& serving_host,
                                                                  const std::string& name, const std::string& without) {
  const std::string kind = absl::GetFlag(FLAGS_data_plane);
  if (kind == "none") return std::unique_ptr<Transport>();
  if (kind != "ucx") return absl::InvalidArgumentError(absl::StrCat("--data_plane=", kind, ": want ucx or none"));
  absl::StatusOr<std::string> secret = DataPlaneSecretFromFlags();
  if (!secret.ok()) return secret.status();
  UcxOptions ucx;
  ucx.loopback_only = common::IsLoopbackHost(serving_host);
  ucx.net_devices = absl::GetFlag(FLAGS_data_plane_devices);
  if (absl::Status s = CheckNetDevicesExist(ucx.net_devices); !s.ok()) return s;
  ucx.tls = absl::GetFlag(FLAGS_data_plane_tls);
  ucx.control_secret = *secret;
  absl::StatusOr<std::unique_ptr<UcxTransport>> t = UcxTransport::Create(ucx);
  if (!t.ok()) {
    // Devices or transports the user chose and UCX refuses are an error, not a fallback.
    if (!ucx.net_devices.empty() || !ucx.tls.empty()) return t.status();
    std::cerr << name << ": no UCX data plane (" << t.status() << "); " << without << std::endl;
    return std::unique_ptr<Transport>();
  }
  if (secret->empty()) return std::unique_ptr<Transport>(std::move(*t));
  return std::unique_ptr<Transport>(std::make_unique<AuthenticatedTransport>(std::move(*t), *secret));
}

}  // namespace rlfleet::transport

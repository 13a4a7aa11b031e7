// The address a service tells others to reach it at (what it registers with the
// controller, and what its listening line prints). A service bound to one address
// advertises that address; one bound to every interface (0.0.0.0 or ::) advertises the
// address of the interface that routes to its registry, never 127.0.0.1 (another host
// cannot reach that). --advertise_address overrides both (e.g. behind NAT, or a
// Kubernetes pod's IP).
#ifndef RLFLEET_LIBS_RPC_ADVERTISE_H_
#define RLFLEET_LIBS_RPC_ADVERTISE_H_

#include <string>

#include "absl/status/statusor.h"

namespace rlfleet::rpc {

// True for 0.0.0.0, ::, [::] and the empty host: bound to every interface.
bool IsWildcardHost(const std::string& host);

// The local address the kernel routes to `host` from (a UDP socket connected to it and
// read back with getsockname: no packet is sent). `host` is an IP literal or a name
// (resolved); a `host:port`, `[v6]:port` or gRPC `dns:///host:port` target is accepted
// too. UNAVAILABLE when there is no route, INVALID_ARGUMENT for what is not a host.
absl::StatusOr<std::string> SourceAddressTowards(const std::string& target);

// The first IPv4 address of an interface that is up and not loopback (then IPv6 global
// addresses); NOT_FOUND when this host has none.
absl::StatusOr<std::string> FirstNonLoopbackAddress();

// What to advertise for a service bound to `bind_host`:
//   - `advertise` when it is set (INVALID_ARGUMENT for a wildcard: others cannot dial it);
//   - `bind_host` when it names one address;
//   - bound to every interface: the source address towards `route_to` (the registry's
//     target) when it is set, routable and not loopback; else FirstNonLoopbackAddress();
//     else 127.0.0.1 (only this host can reach it), with `why` saying so.
// Each fallback is told in `why` (empty when none was needed).
absl::StatusOr<std::string> AdvertisedHost(const std::string& bind_host, const std::string& advertise,
                                           const std::string& route_to, std::string* why);

}  // namespace rlfleet::rpc

#endif  // RLFLEET_LIBS_RPC_ADVERTISE_H_

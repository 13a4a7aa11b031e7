#include "libs/rpc/advertise.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "libs/common/hosts.h"

namespace rlfleet::rpc {
namespace {

// The host part of `target`: "h:p" -> h, "[v6]:p" -> v6, "dns:///h:p" -> h, a bare IPv6
// literal as it is.
std::string HostOf(std::string target) {
  for (absl::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(target, scheme)) {
      target = target.substr(scheme.size());
      break;
    }
  }
  if (absl::StartsWith(target, "[")) {
    const size_t close = target.find(']');
    return close == std::string::npos ? target : target.substr(1, close - 1);
  }
  const size_t first = target.find(':');
  if (first != std::string::npos && target.find(':', first + 1) == std::string::npos) {
    return target.substr(0, first);  // host:port
  }
  return target;  // a name, an IPv4 literal, or a bare IPv6 literal
}

std::string AddressString(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof(text));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, text, sizeof(text));
  }
  return text;
}

}  // namespace

bool IsWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

absl::StatusOr<std::string> SourceAddressTowards(const std::string& target) {
  const std::string host = HostOf(target);
  if (host.empty() || IsWildcardHost(host)) {
    return absl::InvalidArgumentError(absl::StrCat("`", target, "` names no host to route towards"));
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve `", host, "`: ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("no address of `", host, "`"));
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      last = absl::UnavailableError(absl::StrCat("no route to ", host, ": ", std::strerror(errno)));
    } else if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      out = AddressString(reinterpret_cast<const sockaddr*>(&local));
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (out.empty()) return last;
  return out;
}

absl::StatusOr<std::string> FirstNonLoopbackAddress() {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return absl::UnavailableError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
  std::string v4, v6;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    if (i->ifa_addr->sa_family == AF_INET && v4.empty()) {
      v4 = AddressString(i->ifa_addr);
    } else if (i->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      const auto* a6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (!IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) v6 = AddressString(i->ifa_addr);
    }
  }
  freeifaddrs(all);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return absl::NotFoundError("this host has no interface that is up besides loopback");
}

absl::StatusOr<std::string> AdvertisedHost(const std::string& bind_host, const std::string& advertise,
                                           const std::string& route_to, std::string* why) {
  why->clear();
  if (!advertise.empty()) {
    if (IsWildcardHost(advertise)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--advertise_address=", advertise, ": a wildcard is not an address others can dial"));
    }
    return std::string(absl::StripSuffix(absl::StripPrefix(advertise, "["), "]"));
  }
  if (!IsWildcardHost(bind_host)) return std::string(absl::StripSuffix(absl::StripPrefix(bind_host, "["), "]"));
  if (!route_to.empty()) {
    // (a registry on loopback routes from 127.0.0.1, which peers on other hosts that
    // learn the address from it could not dial: then this host's own address)
    absl::StatusOr<std::string> routed = SourceAddressTowards(route_to);
    if (routed.ok() && !common::IsLoopbackHost(*routed)) return routed;
    if (!routed.ok()) {
      absl::StrAppend(why, "no route towards the registry ", route_to, " (", routed.status().message(), "); ");
    }
  }
  absl::StatusOr<std::string> any = FirstNonLoopbackAddress();
  if (any.ok()) {
    if (!why->empty()) absl::StrAppend(why, "advertising ", *any, ", this host's first address");
    return any;
  }
  absl::StrAppend(why, any.status().message(),
                  ": advertising 127.0.0.1, which only this host can reach (set --advertise_address)");
  return std::string("127.0.0.1");
}

}  // namespace rlfleet::rpc

// Host names and addresses as the services' flags and peers give them.
#ifndef RLFLEET_LIBS_COMMON_HOSTS_H_
#define RLFLEET_LIBS_COMMON_HOSTS_H_

#include <string>

namespace rlfleet::common {

// Whether `host` names this machine's loopback (127.x.y.z, ::1, [::1], localhost).
inline bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_HOSTS_H_

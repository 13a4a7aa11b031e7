// HMAC-SHA256 and constant-time comparison: the one place rlfleet calls OpenSSL's
// libcrypto (STYLE.md: one interface per vendor SDK). Used to authenticate memory
// descriptors and the data plane's control messages with the fleet's secret.
#ifndef RLFLEET_LIBS_COMMON_HMAC_H_
#define RLFLEET_LIBS_COMMON_HMAC_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace rlfleet::common {

inline constexpr size_t kHmacSha256Bytes = 32;

// HMAC-SHA256 of `data` under `key`: kHmacSha256Bytes raw bytes. Aborts only if
// libcrypto itself fails (never with valid inputs): a MAC is never made of garbage.
std::string HmacSha256(absl::string_view key, absl::string_view data);

// True if a == b, in time that depends only on the lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_HMAC_H_

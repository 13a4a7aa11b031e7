// Range checks for numbers that arrive from a peer, each in its own type, before any
// cast or allocation (STYLE.md, "Input from the network"). NaN passes every `<`
// comparison, so floating-point checks test std::isfinite first.
#ifndef RLFLEET_LIBS_COMMON_CHECKS_H_
#define RLFLEET_LIBS_COMMON_CHECKS_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace rlfleet::common {

// OK if `value` is finite and lo <= value <= hi; else INVALID_ARGUMENT naming `field`,
// the value and the range ("temperature is nan; it must be finite, in [0, 100]").
inline absl::Status CheckFiniteInRange(absl::string_view field, double value, double lo, double hi) {
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", value, "; it must be a finite number in [", lo, ", ", hi, "]"));
  }
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", value, "; it must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

// OK if `value` is finite (any magnitude); else INVALID_ARGUMENT naming `field`.
inline absl::Status CheckFinite(absl::string_view field, double value) {
  if (std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " is ", value, "; it must be a finite number"));
}

// OK if lo <= value <= hi, compared in the value's own integer type; else
// INVALID_ARGUMENT naming `field`. Use before a narrowing cast:
//   RETURN_IF_ERROR(CheckInRange<uint32_t>("num_samples", r.num_samples(), 1, kMaxSamples));
//   const int n = static_cast<int>(r.num_samples());
template <typename T>
absl::Status CheckInRange(absl::string_view field, T value, T lo, T hi) {
  static_assert(std::is_integral_v<T>, "integers only; use CheckFiniteInRange for floating point");
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " is ", value, "; it must be in [", lo, ", ", hi, "]"));
}

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_CHECKS_H_

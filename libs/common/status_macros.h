// Status helpers: RETURN_IF_ERROR and ASSIGN_OR_RETURN for absl::Status / StatusOr.
#ifndef RLFLEET_LIBS_COMMON_STATUS_MACROS_H_
#define RLFLEET_LIBS_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define RLFLEET_CONCAT_INNER_(a, b) a##b
#define RLFLEET_CONCAT_(a, b) RLFLEET_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) once; returns it from the enclosing function if it
// is not OK.
#define RETURN_IF_ERROR(expr)                                              \
  do {                                                                     \
    ::absl::Status rlfleet_status_ = (expr);                               \
    if (ABSL_PREDICT_FALSE(!rlfleet_status_.ok())) return rlfleet_status_; \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>); on error returns
// its status from the enclosing function, else moves the value into `lhs`, which may be
// a declaration (`auto x`) or an existing variable.
#define ASSIGN_OR_RETURN(lhs, expr) \
  RLFLEET_ASSIGN_OR_RETURN_IMPL_(RLFLEET_CONCAT_(rlfleet_statusor_, __LINE__), lhs, expr)

#define RLFLEET_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)                    \
  auto statusor = (expr);                                                      \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace rlfleet::common {

// Returns `status` with `context` prepended to its message ("context: message"), keeping
// its code. OK stays OK.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_STATUS_MACROS_H_

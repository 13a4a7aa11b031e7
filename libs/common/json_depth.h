// A bound on the nesting of JSON text, checked before a parser builds (and later
// copies and destroys, recursively) a tree from it: every JSON the fleet reads from a
// network or a file goes through CheckJsonDepth first.
#ifndef RLFLEET_LIBS_COMMON_JSON_DEPTH_H_
#define RLFLEET_LIBS_COMMON_JSON_DEPTH_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace rlfleet::common {

// Deep enough for any real request, chat template context or tokenizer.json.
inline constexpr int kMaxJsonDepth = 128;

// INVALID_ARGUMENT naming `what` and the byte offset when arrays / objects in `text`
// nest deeper than `max_depth` (brackets inside strings do not count). Says nothing
// else about validity: the parser still decides that. O(size), no allocation.
absl::Status CheckJsonDepth(absl::string_view text, absl::string_view what, int max_depth = kMaxJsonDepth);

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_JSON_DEPTH_H_

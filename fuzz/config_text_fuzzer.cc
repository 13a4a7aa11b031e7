// libFuzzer harness: the config file parsers over arbitrary text. ParseConfigText: an
// accepted file has non-empty, distinct keys without '=' or comment starts, each value
// is stripped, and every entry's line number lies within the text. ParseRunFile (YAML,
// through yaml-cpp): accepted or INVALID_ARGUMENT, never a crash or an exception; every
// entry names its key in the file and a line within the text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "libs/common/config.h"
#include "libs/common/run_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  int lines = 1;  // (YAML breaks lines at \r too)
  for (char c : text) lines += c == '\n' || c == '\r';
  for (const char* binary : {"rlfleet-trainer", "rlfleet"}) {
    auto run = rlfleet::common::ParseRunFile(text, "fuzz.yaml", binary);
    if (!run.ok() && run.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    if (run.ok()) {
      for (const auto& e : *run) {
        if (e.key.empty() || e.source.empty() || e.line < 1 || e.line > lines) std::abort();
      }
    }
  }
  auto entries = rlfleet::common::ParseConfigText(text, "fuzz.conf");
  if (!entries.ok()) {
    if (entries.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  std::set<std::string> keys;
  for (const auto& e : *entries) {
    if (e.key.empty() || e.key.find('=') != std::string::npos || !keys.insert(e.key).second) std::abort();
    if (e.line < 1 || e.line > lines) std::abort();
    if (absl::StripAsciiWhitespace(e.value) != e.value) std::abort();
  }
  return 0;
}

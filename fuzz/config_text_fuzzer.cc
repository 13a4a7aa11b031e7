// libFuzzer harness: the config file parser (ParseConfigText) over arbitrary text. An
// accepted file has non-empty, distinct keys without '=' or comment starts, each value
// is stripped, and every entry's line number lies within the text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "libs/common/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto entries = rlfleet::common::ParseConfigText(text, "fuzz.conf");
  if (!entries.ok()) {
    if (entries.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  int lines = 1;
  for (char c : text) lines += c == '\n';
  std::set<std::string> keys;
  for (const auto& e : *entries) {
    if (e.key.empty() || e.key.find('=') != std::string::npos || !keys.insert(e.key).second) std::abort();
    if (e.line < 1 || e.line > lines) std::abort();
    if (absl::StripAsciiWhitespace(e.value) != e.value) std::abort();
  }
  return 0;
}

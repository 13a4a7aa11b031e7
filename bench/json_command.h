// A benchmark's reference side run as a command that prints one JSON object (the
// PyTorch scripts): its output, and a number read from it by key.
#ifndef RLFLEET_BENCH_JSON_COMMAND_H_
#define RLFLEET_BENCH_JSON_COMMAND_H_

#include <cstdio>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"

namespace rlfleet::bench {

// What `command` printed on stdout; `exit_code` gets pclose's status (-1: not started).
inline std::string CommandOutput(const std::string& command, int* exit_code) {
  FILE* pipe = popen(command.c_str(), "r");
  std::string out;
  char buf[4096];
  while (pipe != nullptr && fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
  *exit_code = pipe != nullptr ? pclose(pipe) : -1;
  return out;
}

// The number after "key": in `json`, if there is one.
inline std::optional<double> JsonNumber(const std::string& json, const std::string& key) {
  const std::string quoted = "\"" + key + "\": ";
  const size_t at = json.find(quoted);
  if (at == std::string::npos) return std::nullopt;
  const size_t begin = at + quoted.size(), end = json.find_first_of(",}", begin);
  double value = 0;
  if (!absl::SimpleAtod(json.substr(begin, end - begin), &value)) return std::nullopt;
  return value;
}

}  // namespace rlfleet::bench

#endif  // RLFLEET_BENCH_JSON_COMMAND_H_

// libFuzzer harness: the /metrics server's request parser (ParseHttpRequestHead) and
// the response it leads to, over arbitrary bytes. A parsed head never claims more bytes
// than it was given, and a path is a prefix of the target.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "libs/metrics/http_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static rlfleet::metrics::Registry* registry = [] {
    auto* r = new rlfleet::metrics::Registry();
    r->AddCounter("fuzz_total", "Fuzz.", {})->Add(1);
    return r;
  }();
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  // The first byte picks a smaller bound, so the oversized path is reached too.
  const size_t max_bytes = size > 0 && data[0] < 16 ? 1 + data[0] * 16 : rlfleet::metrics::kMaxRequestHeadBytes;
  auto head = rlfleet::metrics::ParseHttpRequestHead(bytes, max_bytes);
  if (!head.ok()) {
    const auto code = head.status().code();
    if (code != absl::StatusCode::kInvalidArgument && code != absl::StatusCode::kResourceExhausted) std::abort();
    const std::string response = rlfleet::metrics::HttpResponseFor(head.status(), registry);
    if (!absl::StartsWith(response, "HTTP/1.1 4")) std::abort();
    return 0;
  }
  if (!head->has_value()) {
    if (bytes.size() >= max_bytes) std::abort();
    return 0;
  }
  const auto& h = **head;
  if (h.head_bytes > bytes.size() || h.head_bytes > max_bytes) std::abort();
  if (!absl::StartsWith(h.target, h.path) || !absl::StartsWith(h.path, "/")) std::abort();
  const std::string response = rlfleet::metrics::HttpResponseFor(h, registry);
  if (!absl::StartsWith(response, "HTTP/1.1 ")) std::abort();
  return 0;
}

// A minimal HTTP/1.1 server for Prometheus scrapes: GET /metrics answers the
// registry's text exposition; another path is 404, another method 405, a malformed or
// oversized request 400 / 431.
//
// One thread polls the listening socket and every open connection (non-blocking), so a
// connection that sends nothing (or reads nothing) never holds up another scrape. Each
// connection has kConnectionDeadline from accept to the last byte sent, a request head
// of at most kMaxRequestHeadBytes, and at most kMaxConnections are open: accepting one
// more closes the open connection closest to its deadline.
//
// Thread safety: Start and the destructor from one thread; the server runs on its own.
#ifndef RLFLEET_LIBS_METRICS_HTTP_SERVER_H_
#define RLFLEET_LIBS_METRICS_HTTP_SERVER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/metrics/metrics.h"

namespace rlfleet::metrics {

inline constexpr size_t kMaxRequestHeadBytes = 8192;
inline constexpr int kMaxRequestHeaders = 64;
inline constexpr int kMaxConnections = 32;
inline constexpr absl::Duration kConnectionDeadline = absl::Seconds(5);

// The request line of an HTTP/1.x request head.
struct HttpRequestHead {
  std::string method;     // "GET"
  std::string target;     // "/metrics?x=1"
  std::string path;       // "/metrics" (the target up to '?')
  size_t head_bytes = 0;  // through the blank line that ends the head
  // The header fields in order: names in lower case, values without surrounding blanks.
  std::vector<std::pair<std::string, std::string>> headers;

  // The value of the first header named `name` (lower case), if any.
  std::optional<std::string> Header(absl::string_view name) const {
    for (const auto& [n, v] : headers) {
      if (n == name) return v;
    }
    return std::nullopt;
  }
};

// Parses the head of an HTTP/1.x request from the bytes received so far: nullopt while
// the blank line (CRLF CRLF) that ends it has not arrived and fewer than `max_bytes`
// have; RESOURCE_EXHAUSTED for a head longer than `max_bytes` (without its end);
// INVALID_ARGUMENT for a malformed one (request line not `METHOD SP /target SP HTTP/1.x`, control bytes, a
// header line without a token and ':', more than kMaxRequestHeaders headers). Pure.
absl::StatusOr<std::optional<HttpRequestHead>> ParseHttpRequestHead(absl::string_view received,
                                                                    size_t max_bytes = kMaxRequestHeadBytes);

// The whole HTTP/1.1 response (Connection: close) the server sends for `request` (an
// error from ParseHttpRequestHead answers 400, or 431 for RESOURCE_EXHAUSTED); the
// registry is rendered only for GET /metrics. Pure but for `registry`.
std::string HttpResponseFor(const absl::StatusOr<HttpRequestHead>& request, Registry* registry);

class MetricsServer {
 public:
  // Listens on host:port (IPv4; "" or "localhost" is 127.0.0.1; port 0 picks a free
  // one). INVALID_ARGUMENT for a host that is not an IPv4 address, UNAVAILABLE if it
  // cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host, int port, Registry* registry);
  ~MetricsServer();  // closes every connection and stops at once
  int port() const { return port_; }
  // The IPv4 address bound ("127.0.0.1", "0.0.0.0", ...).
  const std::string& host() const { return host_; }

 private:
  MetricsServer(int fd, std::string host, int port, Registry* registry);
  void Loop();

  const int fd_;
  const std::string host_;
  const int port_;
  Registry* const registry_;
  int wake_[2] = {-1, -1};  // written by the destructor to end Loop()
  std::thread thread_;
};

// A plain HTTP/1.1 GET (IPv4, Connection: close): the status code, the head (status
// line and headers) and the body. UNAVAILABLE if it cannot connect, DEADLINE_EXCEEDED
// after `timeout`, INTERNAL for an answer that is not HTTP.
struct HttpResponse {
  int status = 0;
  std::string head;
  std::string body;
};
absl::StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& path,
                                     absl::Duration timeout);

// GET http://host:port/metrics, the body; errors as HttpGet, INTERNAL for a non-200.
absl::StatusOr<std::string> FetchMetrics(const std::string& host, int port, absl::Duration timeout);

// The value of the first sample of `name` (any labels) in a text exposition.
std::optional<double> FindSample(const std::string& exposition, const std::string& name);

}  // namespace rlfleet::metrics

#endif  // RLFLEET_LIBS_METRICS_HTTP_SERVER_H_

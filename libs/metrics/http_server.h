// A minimal HTTP/1.1 server for Prometheus scrapes: GET /metrics answers the
// registry's text exposition; anything else is 404. One connection at a time on a
// thread of its own (scrapes are rare and small); each request gets a 5 s deadline.
#ifndef RLFLEET_LIBS_METRICS_HTTP_SERVER_H_
#define RLFLEET_LIBS_METRICS_HTTP_SERVER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/metrics/metrics.h"

namespace rlfleet::metrics {

class MetricsServer {
 public:
  // Listens on host:port (IPv4; port 0 picks a free one). UNAVAILABLE if it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host, int port,
                                                              Registry* registry);
  ~MetricsServer();  // stops within ~200 ms
  int port() const { return port_; }

 private:
  MetricsServer(int fd, int port, Registry* registry);
  void Loop();
  void Serve(int connection);

  const int fd_;
  const int port_;
  Registry* const registry_;
  std::atomic<bool> stop_{false};
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

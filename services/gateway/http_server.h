// The gateway's HTTP/1.1 server: one request per connection (Connection: close), a
// body by Content-Length, and a response either whole or streamed (server-sent events:
// the body ends when the connection closes).
//
// A thread per connection, at most Options::max_connections at once (one more is
// answered 503 at once), since a request lives as long as its generation. Reading the
// request has Options::read_timeout; the head is parsed by metrics::ParseHttpRequestHead
// (400 / 431 for a bad or long one), a body past Options::max_body_bytes is 413, a body
// without Content-Length (chunked) is 411. The handler runs on the connection's thread.
//
// Thread safety: Start and the destructor from one thread; handlers run concurrently.
#ifndef RLFLEET_SERVICES_GATEWAY_HTTP_SERVER_H_
#define RLFLEET_SERVICES_GATEWAY_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/metrics/http_server.h"

namespace rlfleet::gateway {

struct HttpRequest {
  metrics::HttpRequestHead head;
  std::string body;
};

// How a handler answers: Send once, or StartStream then Write* (each write is sent at
// once). Whatever the handler leaves unanswered becomes a 500.
class HttpResponder {
 public:
  explicit HttpResponder(int fd) : fd_(fd) {}
  // A whole response: `status` is the code ("200 OK" is written from 200).
  void Send(int status, absl::string_view content_type, absl::string_view body);
  // The head of a streamed response (no Content-Length: the body ends at close).
  bool StartStream(int status, absl::string_view content_type);
  // More of a streamed body; false once the client is gone (stop generating).
  bool Write(absl::string_view data);
  bool answered() const { return answered_; }

 private:
  bool SendAll(absl::string_view data);
  const int fd_;
  bool answered_ = false;
  bool broken_ = false;
};

// The reason phrase of an HTTP status code ("Not Found").
absl::string_view HttpReason(int status);

class HttpServer {
 public:
  using Handler = std::function<void(const HttpRequest&, HttpResponder*)>;
  struct Options {
    int max_connections = 256;
    size_t max_body_bytes = 4 << 20;
    absl::Duration read_timeout = absl::Seconds(30);
  };
  // Listens on host:port (IPv4; port 0 picks one). INVALID_ARGUMENT for a host that is
  // not an IPv4 address, UNAVAILABLE if it cannot bind.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& host, int port, Handler handler,
                                                           Options options);
  // Stops accepting, shuts every open connection down (its handler's writes fail) and
  // waits for their threads.
  ~HttpServer();
  int port() const { return port_; }

 private:
  HttpServer(int fd, int port, Handler handler, Options options);
  void AcceptLoop();
  void Serve(int fd);

  const int fd_;
  const int port_;
  const Handler handler_;
  const Options options_;
  int wake_[2] = {-1, -1};
  std::thread acceptor_;
  absl::Mutex mu_;
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);  // the open connections
};

}  // namespace rlfleet::gateway

#endif  // RLFLEET_SERVICES_GATEWAY_HTTP_SERVER_H_

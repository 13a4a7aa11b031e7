// The one HTTP/1.1 server of the fleet, on cpp-httplib (Debian's libcpp-httplib-dev):
// keep-alive, read / write / keep-alive timeouts, a body limit, chunked streaming, and
// what the library leaves to its user: a thread per connection up to a limit (past it,
// a connection is answered 503 by a second, equally bounded set of threads, and past
// both it waits), a check of the request's head before its body is read (API keys,
// rate limits), every exception of a handler turned into a 500 (the process lives),
// and whether the client is still connected (to cancel work nobody waits for).
//
// Thread safety: Start and the destructor from one thread; the handler and the head
// check run concurrently, one call per request, on the connection's thread.
#ifndef RLFLEET_LIBS_HTTP_HTTP_SERVER_H_
#define RLFLEET_LIBS_HTTP_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rlfleet::http {

struct Request {
  std::string method;  // "GET"
  std::string path;    // "/v1/models" (no query)
  // The header fields: names in lower case.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;         // empty in the head check
  std::string remote_addr;  // the peer's IP address
  // True while the client has not closed or reset its connection. Call it only from
  // the handler's thread; the first call costs a scan of the process's descriptors.
  std::function<bool()> connected = [] { return true; };

  // The value of the first header named `name` (lower case), if any.
  std::optional<std::string> Header(absl::string_view name) const;
};

// Where a streamed body goes. Write returns false once the client is gone (stop).
class StreamWriter {
 public:
  virtual ~StreamWriter() = default;
  virtual bool Write(absl::string_view data) = 0;
};

struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones (Retry-After)
  // Set: the body is streamed (chunked) by this function, called on the connection's
  // thread once the head is sent; `body` is ignored. An exception it throws ends the
  // stream (logged).
  std::function<void(StreamWriter&)> stream;
};

// An error reply in OpenAI's shape ({"error": {"message", "type", "param", "code"}}).
Reply JsonError(int status, absl::string_view message, absl::string_view type = "invalid_request_error");

class Server {
 public:
  struct Options {
    // Connections served at once, a thread each. As many more are answered 503
    // ("busy"); past that, a new connection waits for a thread.
    int max_connections = 256;
    size_t max_body_bytes = 4 << 20;                   // 413 past it
    absl::Duration read_timeout = absl::Seconds(30);   // each read of a request
    absl::Duration write_timeout = absl::Seconds(30);  // each write of a reply (a stalled reader)
    absl::Duration keep_alive_timeout = absl::Seconds(5);
    int keep_alive_max_requests = 100;
    // The paths whose requests reach the handler with their body; a request for any
    // other path reaches it without one (to be answered 404 / 405).
    std::vector<std::string> paths;
  };
  using Handler = std::function<Reply(const Request&)>;
  // Called with a request's head (body empty) before its body is read: a reply
  // refuses the request there (401, 429); nullopt lets it go on.
  using HeadCheck = std::function<std::optional<Reply>(const Request&)>;

  // Listens on host:port (IPv4; "" or "localhost" is 127.0.0.1; port 0 picks one) and
  // serves on threads of its own. INVALID_ARGUMENT for a host that is not an IPv4
  // address, UNAVAILABLE if it cannot bind.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const std::string& host, int port, Options options,
                                                       Handler handler, HeadCheck head_check = nullptr);
  // Stops accepting and waits for the connections being served (a handler still
  // generating must be ended by its owner first).
  ~Server();
  int port() const { return port_; }

  struct Impl;

 private:
  Server(std::unique_ptr<Impl> impl, int port);
  std::unique_ptr<Impl> impl_;
  const int port_;
};

// Whether an IPv4 host names this machine only (127.0.0.0/8, "localhost", "").
bool IsLoopbackHost(absl::string_view host);

// Compares two secrets in time that depends on their lengths only.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace rlfleet::http

#endif  // RLFLEET_LIBS_HTTP_HTTP_SERVER_H_

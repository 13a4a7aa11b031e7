// A raw HTTP/1.1 client for tests: exact bytes out (malformed ones included), the whole
// answer back, its chunked body decoded. Not for production use.
#ifndef RLFLEET_LIBS_HTTP_RAW_CLIENT_H_
#define RLFLEET_LIBS_HTTP_RAW_CLIENT_H_

#include <string>

#include "absl/time/time.h"

namespace rlfleet::http {

struct RawReply {
  int status = 0;    // 0: no answer
  std::string head;  // the status line and headers
  std::string body;  // de-chunked
};

// A connected TCP socket to 127.0.0.1:port (receive timeout `timeout`), or -1.
int ConnectLoopback(int port, absl::Duration timeout = absl::Seconds(10));
// Sends all of `bytes`; false if the connection failed.
bool SendAll(int fd, const std::string& bytes);
// Reads one answer: its head, then its body by Content-Length, chunks or the close.
// Does not close `fd`.
RawReply ReadReply(int fd);
// Connects, sends `raw`, reads one answer, closes.
RawReply Exchange(int port, const std::string& raw);
// A request with Content-Length and `Connection: close`.
std::string RawRequest(const std::string& method, const std::string& path, const std::string& body,
                       const std::string& extra_headers = "");

}  // namespace rlfleet::http

#endif  // RLFLEET_LIBS_HTTP_RAW_CLIENT_H_

#include "libs/metrics/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/time.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace rlfleet::metrics {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host, int port,
                                                                    Registry* registry) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string ip = host.empty() || host == "localhost" ? "127.0.0.1" : host;
  if (inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("metrics host `", host, "` is not an IPv4 address"));
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
    const std::string why = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", ip, ":", port, ": ", why));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::unique_ptr<MetricsServer> server(new MetricsServer(fd, ntohs(addr.sin_port), registry));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

MetricsServer::MetricsServer(int fd, int port, Registry* registry) : fd_(fd), port_(port), registry_(registry) {}

MetricsServer::~MetricsServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void MetricsServer::Loop() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    Serve(c);
    close(c);
  }
}

void MetricsServer::Serve(int c) {
  // Read the request head (up to a blank line), 5 s at most.
  std::string request;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  char buffer[4096];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 65536) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return;
    pollfd p{c, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) return;
    const ssize_t n = read(c, buffer, sizeof(buffer));
    if (n <= 0) return;
    request.append(buffer, n);
  }
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (absl::StartsWith(request, "GET /metrics ") || absl::StartsWith(request, "GET /metrics?")) {
    body = registry_->Render();
  } else {
    status = "404 Not Found";
    type = "text/plain; charset=utf-8";
    body = "not found: this server serves GET /metrics\n";
  }
  const std::string response = absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                                            "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n",
                                            body);
  size_t sent = 0;
  while (sent < response.size()) {
    const ssize_t n = send(c, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += n;
  }
}

absl::StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& path,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("`", host, "` is not an IPv4 address"));
  }
  const timeval tv{static_cast<time_t>(std::max<int64_t>(1, absl::ToInt64Seconds(timeout))), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const std::string url = absl::StrCat("http://", host, ":", port, path);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const std::string why = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("GET ", url, ": ", why));
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
  (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char buffer[8192];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) {
    response.append(buffer, n);
    if (absl::Now() > deadline) break;
  }
  close(fd);
  if (absl::Now() > deadline) return absl::DeadlineExceededError(absl::StrCat("GET ", url));
  const size_t split = response.find("\r\n\r\n");
  HttpResponse out;
  if (!absl::StartsWith(response, "HTTP/1.1 ") || split == std::string::npos ||
      !absl::SimpleAtoi(response.substr(9, 3), &out.status)) {
    return absl::InternalError(absl::StrCat("GET ", url, ": not an HTTP answer"));
  }
  out.head = response.substr(0, split);
  out.body = response.substr(split + 4);
  return out;
}

absl::StatusOr<std::string> FetchMetrics(const std::string& host, int port, absl::Duration timeout) {
  absl::StatusOr<HttpResponse> r = HttpGet(host, port, "/metrics", timeout);
  if (!r.ok()) return r.status();
  if (r->status != 200) {
    return absl::InternalError(absl::StrCat("GET http://", host, ":", port, "/metrics: ",
                                            r->head.substr(0, r->head.find('\r'))));
  }
  return std::move(r->body);
}

std::optional<double> FindSample(const std::string& exposition, const std::string& name) {
  size_t pos = 0;
  while ((pos = exposition.find(name, pos)) != std::string::npos) {
    const bool line_start = pos == 0 || exposition[pos - 1] == '\n';
    const size_t after = pos + name.size();
    if (line_start && after < exposition.size() && (exposition[after] == ' ' || exposition[after] == '{')) {
      const size_t end = exposition.find('\n', after);
      const std::string line = exposition.substr(after, end == std::string::npos ? std::string::npos : end - after);
      const size_t space = line.rfind(' ');
      double v = 0;
      if (space != std::string::npos && absl::SimpleAtod(line.substr(space + 1), &v)) return v;
    }
    pos = after;
  }
  return std::nullopt;
}

}  // namespace rlfleet::metrics

#include "libs/metrics/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace rlfleet::metrics {

namespace {

bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || absl::StrContains("!#$%&'*+-.^_`|~", c);
}

bool HasControlBytes(absl::string_view s) {
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::optional<HttpRequestHead>> ParseHttpRequestHead(absl::string_view received, size_t max_bytes) {
  const size_t end = received.substr(0, max_bytes).find("\r\n\r\n");
  if (end == absl::string_view::npos) {
    if (received.size() >= max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("request head: longer than ", max_bytes, " bytes"));
    }
    return std::nullopt;
  }
  HttpRequestHead head;
  head.head_bytes = end + 4;
  std::vector<absl::string_view> lines = absl::StrSplit(received.substr(0, end), "\r\n");
  // The request line: METHOD SP TARGET SP HTTP/1.x
  const std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3) return absl::InvalidArgumentError("request line: not `METHOD TARGET VERSION`");
  if (parts[0].empty() || !std::all_of(parts[0].begin(), parts[0].end(), IsTokenChar)) {
    return absl::InvalidArgumentError("request line: bad method");
  }
  if (!absl::StartsWith(parts[1], "/") || HasControlBytes(parts[1])) {
    return absl::InvalidArgumentError("request line: the target is not an absolute path");
  }
  if (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") {
    return absl::InvalidArgumentError("request line: version is not HTTP/1.0 or HTTP/1.1");
  }
  if (lines.size() - 1 > static_cast<size_t>(kMaxRequestHeaders)) {
    return absl::InvalidArgumentError(absl::StrCat("request head: more than ", kMaxRequestHeaders, " headers"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    const size_t colon = line.find(':');
    if (colon == 0 || colon == absl::string_view::npos ||
        !std::all_of(line.begin(), line.begin() + colon, IsTokenChar)) {
      return absl::InvalidArgumentError(absl::StrCat("request head: header line ", i, " is not `name: value`"));
    }
    for (char c : line.substr(colon + 1)) {
      const unsigned char u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\t') || u == 0x7f) {
        return absl::InvalidArgumentError(absl::StrCat("request head: header line ", i, " has control bytes"));
      }
    }
    head.headers.emplace_back(absl::AsciiStrToLower(line.substr(0, colon)),
                              std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
  }
  head.method = std::string(parts[0]);
  head.target = std::string(parts[1]);
  head.path = std::string(parts[1].substr(0, parts[1].find('?')));
  return head;
}

std::string HttpResponseFor(const absl::StatusOr<HttpRequestHead>& request, Registry* registry) {
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (!request.ok()) {
    status = request.status().code() == absl::StatusCode::kResourceExhausted ? "431 Request Header Fields Too Large"
                                                                             : "400 Bad Request";
    type = "text/plain; charset=utf-8";
    body = absl::StrCat(request.status().message(), "\n");
  } else if (request->method != "GET") {
    status = "405 Method Not Allowed";
    type = "text/plain; charset=utf-8";
    body = "this server serves GET /metrics\n";
  } else if (request->path == "/metrics") {
    body = registry->Render();
  } else {
    status = "404 Not Found";
    type = "text/plain; charset=utf-8";
    body = "not found: this server serves GET /metrics\n";
  }
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type, "\r\nContent-Length: ", body.size(),
                      absl::StartsWith(status, "405") ? "\r\nAllow: GET" : "", "\r\nConnection: close\r\n\r\n", body);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host, int port,
                                                                    Registry* registry) {
  if (port < 0 || port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", port, " is out of range"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string ip = host.empty() || host == "localhost" ? "127.0.0.1" : host;
  if (inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("metrics host `", host, "` is not an IPv4 address"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0) {
    const std::string why = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", ip, ":", port, ": ", why));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::unique_ptr<MetricsServer> server(new MetricsServer(fd, ip, ntohs(addr.sin_port), registry));
  if (pipe2(server->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe2: ", strerror(errno)));  // the destructor closes fd
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

MetricsServer::MetricsServer(int fd, std::string host, int port, Registry* registry)
    : fd_(fd), host_(std::move(host)), port_(port), registry_(registry) {}

MetricsServer::~MetricsServer() {
  if (wake_[1] >= 0) {
    const char b = 0;
    (void)!write(wake_[1], &b, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int f : wake_) {
    if (f >= 0) close(f);
  }
  close(fd_);
}

namespace {

// One accepted connection: reading its request head, then writing the response.
struct Connection {
  int fd = -1;
  absl::Time deadline;
  std::string in;
  std::string out;
  size_t sent = 0;
  bool responding = false;
};

// Sends what it can without blocking. False when the connection is done (all sent, or
// a send error): close it.
bool SendSome(Connection& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) return false;
    c.sent += static_cast<size_t>(n);
  }
  shutdown(c.fd, SHUT_WR);
  return false;
}

// Reads what has arrived; once the head is complete (or bad) prepares the response and
// starts sending it. False when the connection is done.
bool ReadSome(Connection& c, Registry* registry) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(c.fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) return false;  // closed before a whole request: nothing to answer
    c.in.append(buffer, static_cast<size_t>(n));
    absl::StatusOr<std::optional<HttpRequestHead>> head = ParseHttpRequestHead(c.in);
    if (head.ok() && !head->has_value()) continue;
    c.out = head.ok() ? HttpResponseFor(**head, registry) : HttpResponseFor(head.status(), registry);
    c.responding = true;
    c.in.clear();
    return SendSome(c);
  }
}

}  // namespace

void MetricsServer::Loop() {
  std::vector<Connection> connections;
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({fd_, POLLIN, 0});
    absl::Time next = absl::InfiniteFuture();
    for (const Connection& c : connections) {
      fds.push_back({c.fd, static_cast<short>(c.responding ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.deadline);
    }
    int timeout_ms = -1;
    if (next != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(next - absl::Now(), absl::Milliseconds(1))), 0, 60000));
    }
    const int ready = poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0 && (fds[0].revents & POLLIN)) break;  // the destructor
    const absl::Time now = absl::Now();
    // Serve the open connections; drop those done or past their deadline.
    std::vector<Connection> open;
    open.reserve(connections.size() + 1);
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& c = connections[i];
      const short revents = ready > 0 ? fds[i + 2].revents : 0;
      bool keep = now < c.deadline;
      if (keep && revents != 0) {
        keep = c.responding ? SendSome(c) : ReadSome(c, registry_);
      }
      if (keep) {
        open.push_back(std::move(c));
      } else {
        close(c.fd);
      }
    }
    connections = std::move(open);
    if (ready <= 0 || !(fds[1].revents & POLLIN)) continue;
    // Accept what is waiting; when full, the connection nearest its deadline makes room.
    for (int accepted = 0; accepted < kMaxConnections; ++accepted) {
      const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) break;
      if (connections.size() >= static_cast<size_t>(kMaxConnections)) {
        auto oldest =
            std::min_element(connections.begin(), connections.end(),
                             [](const Connection& a, const Connection& b) { return a.deadline < b.deadline; });
        close(oldest->fd);
        connections.erase(oldest);
      }
      Connection c;
      c.fd = fd;
      c.deadline = now + kConnectionDeadline;
      connections.push_back(std::move(c));
    }
  }
  for (const Connection& c : connections) close(c.fd);
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
    return absl::InternalError(
        absl::StrCat("GET http://", host, ":", port, "/metrics: ", r->head.substr(0, r->head.find('\r'))));
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

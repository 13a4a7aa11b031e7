#include "services/gateway/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace rlfleet::gateway {

absl::string_view HttpReason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return status < 400 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
  }
}

bool HttpResponder::SendAll(absl::string_view data) {
  while (!broken_ && !data.empty()) {
    const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      break;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return !broken_;
}

void HttpResponder::Send(int status, absl::string_view content_type, absl::string_view body) {
  if (answered_) return;
  answered_ = true;
  SendAll(absl::StrCat("HTTP/1.1 ", status, " ", HttpReason(status), "\r\nContent-Type: ", content_type,
                       "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n"));
  SendAll(body);
}

bool HttpResponder::StartStream(int status, absl::string_view content_type) {
  if (answered_) return false;
  answered_ = true;
  return SendAll(absl::StrCat("HTTP/1.1 ", status, " ", HttpReason(status), "\r\nContent-Type: ", content_type,
                              "\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n"));
}

bool HttpResponder::Write(absl::string_view data) { return SendAll(data); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& host, int port, Handler handler,
                                                              Options options) {
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("HTTP port ", port, " is out of range"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string ip = host.empty() || host == "localhost" ? "127.0.0.1" : host;
  if (inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("HTTP host `", host, "` is not an IPv4 address"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 128) != 0) {
    const std::string why = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", ip, ":", port, ": ", why));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::unique_ptr<HttpServer> server(new HttpServer(fd, ntohs(addr.sin_port), std::move(handler), options));
  if (pipe2(server->wake_, O_CLOEXEC) != 0) return absl::UnavailableError(absl::StrCat("pipe2: ", strerror(errno)));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

HttpServer::HttpServer(int fd, int port, Handler handler, Options options)
    : fd_(fd), port_(port), handler_(std::move(handler)), options_(options) {}

HttpServer::~HttpServer() {
  if (wake_[1] >= 0) {
    const char b = 0;
    (void)!write(wake_[1], &b, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  for (int fd : fds_) shutdown(fd, SHUT_RDWR);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_ == 0; };
  mu_.Await(absl::Condition(&idle));
  for (int f : wake_) {
    if (f >= 0) close(f);
  }
  close(fd_);
}

void HttpServer::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{wake_[0], POLLIN, 0}, {fd_, POLLIN, 0}};
    const int ready = poll(fds, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || (fds[0].revents & POLLIN)) return;
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    {
      absl::MutexLock lock(&mu_);
      if (open_ < options_.max_connections) {
        ++open_;
        fds_.push_back(fd);
        std::thread([this, fd] { Serve(fd); }).detach();
        continue;
      }
    }
    HttpResponder busy(fd);
    busy.Send(
        503, "application/json",
        R"({"error":{"message":"the gateway is at its connection limit; retry later","type":"server_error","param":null,"code":null}})");
    close(fd);
  }
}

namespace {

// Reads into `in` until the head is complete and then `body_bytes` more; false at the
// deadline or when the peer closes first.
bool ReadUntil(int fd, std::string* in, size_t want, absl::Time deadline) {
  char buffer[16384];
  while (in->size() < want) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 60000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    in->append(buffer, static_cast<size_t>(n));
  }
  return true;
}

std::string ErrorJson(absl::string_view message) {
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
  }
  return absl::StrCat(R"({"error":{"message":")", escaped,
                      R"(","type":"invalid_request_error","param":null,"code":null}})");
}

}  // namespace

void HttpServer::Serve(int fd) {
  HttpResponder responder(fd);
  const absl::Time deadline = absl::Now() + options_.read_timeout;
  std::string in;
  std::optional<metrics::HttpRequestHead> head;
  while (!head.has_value()) {
    absl::StatusOr<std::optional<metrics::HttpRequestHead>> parsed = metrics::ParseHttpRequestHead(in);
    if (!parsed.ok()) {
      const int status = parsed.status().code() == absl::StatusCode::kResourceExhausted ? 431 : 400;
      responder.Send(status, "application/json", ErrorJson(parsed.status().message()));
      break;
    }
    if (parsed->has_value()) {
      head = std::move(**parsed);
      break;
    }
    const size_t before = in.size();
    if (!ReadUntil(fd, &in, before + 1, deadline)) break;
  }
  if (head.has_value()) {
    HttpRequest request;
    size_t length = 0;
    const std::optional<std::string> content_length = head->Header("content-length");
    if (head->Header("transfer-encoding").has_value()) {
      responder.Send(411, "application/json", ErrorJson("send the body with Content-Length (no chunked encoding)"));
    } else if (content_length.has_value() && !absl::SimpleAtoi(*content_length, &length)) {
      responder.Send(400, "application/json", ErrorJson("Content-Length is not a number"));
    } else if (length > options_.max_body_bytes) {
      responder.Send(413, "application/json",
                     ErrorJson(absl::StrCat("the body is ", length, " bytes, more than the gateway's limit of ",
                                            options_.max_body_bytes)));
    } else if (!ReadUntil(fd, &in, head->head_bytes + length, deadline)) {
      responder.Send(408, "application/json", ErrorJson("the request's body did not arrive in time"));
    } else {
      request.body = in.substr(head->head_bytes, length);
      request.head = std::move(*head);
      handler_(request, &responder);
      if (!responder.answered()) responder.Send(500, "application/json", ErrorJson("the handler did not answer"));
    }
  }
  shutdown(fd, SHUT_WR);
  // Let the client read the answer before the close (a close with unread input resets).
  std::string rest;
  ReadUntil(fd, &rest, 1 << 20, absl::Now() + absl::Milliseconds(200));
  absl::MutexLock lock(&mu_);  // (out of fds_ before the number can be reused)
  fds_.erase(std::find(fds_.begin(), fds_.end(), fd));
  close(fd);
  --open_;
}

}  // namespace rlfleet::gateway

#include "libs/http/raw_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace rlfleet::http {
namespace {

// Reads more bytes into `in`; false at the end or an error.
bool ReadMore(int fd, std::string* in) {
  char buffer[16384];
  const ssize_t n = read(fd, buffer, sizeof(buffer));
  if (n <= 0) return false;
  in->append(buffer, static_cast<size_t>(n));
  return true;
}

}  // namespace

int ConnectLoopback(int port, absl::Duration timeout) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  timeval tv{static_cast<time_t>(absl::ToInt64Seconds(timeout)),
             static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout) % 1000000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

RawReply ReadReply(int fd) {
  RawReply r;
  std::string in;
  size_t split;
  while ((split = in.find("\r\n\r\n")) == std::string::npos) {
    if (!ReadMore(fd, &in)) return r;
  }
  r.head = in.substr(0, split);
  std::string rest = in.substr(split + 4);
  if (r.head.size() < 12 || !absl::SimpleAtoi(r.head.substr(9, 3), &r.status)) r.status = 0;
  const std::string lower = absl::AsciiStrToLower(r.head);
  const size_t cl = lower.find("\r\ncontent-length:");
  if (lower.find("\r\ntransfer-encoding: chunked") != std::string::npos) {
    for (;;) {
      size_t eol;
      while ((eol = rest.find("\r\n")) == std::string::npos) {
        if (!ReadMore(fd, &rest)) return r;
      }
      size_t size = 0;
      if (!absl::SimpleHexAtoi(rest.substr(0, eol), &size)) return r;
      while (rest.size() < eol + 2 + size + 2) {
        if (!ReadMore(fd, &rest)) {
          r.body += rest.substr(std::min(rest.size(), eol + 2));  // (a cut stream: what came)
          return r;
        }
      }
      if (size == 0) return r;
      r.body += rest.substr(eol + 2, size);
      rest.erase(0, eol + 2 + size + 2);
    }
  }
  if (cl != std::string::npos) {
    size_t length = 0;
    const size_t end = lower.find("\r\n", cl + 2);
    (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(lower.substr(cl + 17, end - cl - 17)), &length);
    while (rest.size() < length && ReadMore(fd, &rest)) {
    }
    r.body = rest.substr(0, length);
    return r;
  }
  while (ReadMore(fd, &rest)) {
  }
  r.body = rest;
  return r;
}

RawReply Exchange(int port, const std::string& raw) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return {};
  SendAll(fd, raw);
  RawReply r = ReadReply(fd);
  close(fd);
  return r;
}

std::string RawRequest(const std::string& method, const std::string& path, const std::string& body,
                       const std::string& extra_headers) {
  return absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n",
                      "Content-Type: application/json\r\n", extra_headers, "Content-Length: ", body.size(), "\r\n\r\n",
                      body);
}

}  // namespace rlfleet::http

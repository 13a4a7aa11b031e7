// A plain HTTP/1.1 GET on loopback for tests (metrics endpoints, Prometheus's API).
#ifndef RLFLEET_TESTS_UTIL_HTTP_GET_H_
#define RLFLEET_TESTS_UTIL_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace rlfleet::testing {

// The whole response (status line, headers, body) of GET `path` from 127.0.0.1:port;
// empty if it cannot connect.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) out.append(buffer, n);
  close(fd);
  return out;
}

}  // namespace rlfleet::testing

#endif  // RLFLEET_TESTS_UTIL_HTTP_GET_H_

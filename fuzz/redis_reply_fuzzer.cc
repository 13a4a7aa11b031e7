// libFuzzer harness: Redis replies as our client reads them. A fake Redis on loopback
// answers PING with +PONG and then sends the fuzzer's bytes as the replies to a
// pipeline (GET, or MULTI / SET / EXEC, chosen by the first byte), so the bytes go
// through hiredis's reader, then our conversion of its reply trees and our checks of
// them (errors nested in EXEC's array, EXEC answering nil). Every call must end in
// replies or a status, never a crash or a hang.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "libs/redis/redis_client.h"

namespace {

absl::Mutex mu;
std::string* next_reply = new std::string();  // guarded by mu

// Serves one connection at a time: +PONG and the current reply bytes, then waits for
// the client to close.
int StartFakeRedis() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) std::abort();
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread([fd] {
    for (;;) {
      const int c = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::string out = "+PONG\r\n";
      {
        absl::MutexLock lock(&mu);
        out += *next_reply;
      }
      for (size_t sent = 0; sent < out.size();) {
        const ssize_t n = send(c, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
      shutdown(c, SHUT_WR);
      char buffer[4096];
      while (read(c, buffer, sizeof(buffer)) > 0) {
      }
      close(c);
    }
  }).detach();
  return ntohs(addr.sin_port);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int port = StartFakeRedis();
  if (size == 0) return 0;
  {
    absl::MutexLock lock(&mu);
    next_reply->assign(reinterpret_cast<const char*>(data) + 1, size - 1);
  }
  auto client = rlfleet::redis::Client::Connect("127.0.0.1", port, absl::Seconds(2));
  if (!client.ok()) return 0;
  std::vector<std::vector<std::string>> commands;
  switch (data[0] % 3) {
    case 0:
      commands = {{"GET", "k"}};
      break;
    case 1:
      commands = {{"MULTI"}, {"SET", "k", "v"}, {"EXEC"}};
      break;
    default:
      commands = {{"HGETALL", "h"}, {"LRANGE", "l", "0", "-1"}};
  }
  auto replies = (*client)->Pipeline(commands);
  if (replies.ok() && replies->size() != commands.size()) std::abort();
  return 0;
}
